"""lmlab.data"""
