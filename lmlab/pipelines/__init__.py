"""lmlab.pipelines"""
