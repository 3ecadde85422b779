"""lmlab.generation"""
