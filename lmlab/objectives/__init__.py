"""lmlab.objectives"""
