"""lmlab.analysis"""
