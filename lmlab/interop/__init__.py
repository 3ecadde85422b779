"""Reading and writing the checkpoints people already have.

Interop is a mapping layer kept apart from the model code (ARCHITECTURE.md, principle 3): each
family module in :mod:`lmlab.interop.families` is a table of config fields and weight names
(with the few transforms some formats need: transposes, fused projections), and
:mod:`lmlab.interop.hf` applies it to Hugging Face folders (config.json + safetensors).
"""
