"""lmlab.training"""
