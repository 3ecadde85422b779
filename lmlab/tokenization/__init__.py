"""lmlab.tokenization"""
