"""Reading and writing the checkpoints people already have: the family specs of
:mod:`lmlab.models.families` applied to Hugging Face folders, GGUF files and lmlab's own folders.
"""
