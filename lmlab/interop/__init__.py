"""Reading and writing the checkpoints people already have.

Interop is a mapping layer kept apart from the model code (ARCHITECTURE.md, principle 3): each
family module in :mod:`lmlab.models.families` defines its family once (shape, preset sizes,
config rename tables, weight names with the few transforms some formats need), and
:mod:`lmlab.interop.hf` / :mod:`lmlab.interop.gguf` apply it to Hugging Face folders and GGUF files.
"""
