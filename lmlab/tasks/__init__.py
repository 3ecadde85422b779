"""lmlab.tasks"""
