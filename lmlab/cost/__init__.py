"""lmlab.cost"""
