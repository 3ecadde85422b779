"""lmlab.interop"""
