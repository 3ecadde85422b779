"""Making a trained model smaller or cheaper: pruning (``heads``, ``magnitude``), low-rank
factorisation (``lowrank``), and the quantisation and distillation modules beside them.

Each module is one method; ``lmlab compress ...`` (``lmlab/cli/compress.py``) is its command line.
"""
