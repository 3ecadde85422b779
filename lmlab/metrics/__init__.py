"""lmlab.metrics"""
