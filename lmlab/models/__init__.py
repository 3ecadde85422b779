"""lmlab.models"""
