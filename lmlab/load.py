"""The one entry point from a path to a model: ``lmlab.from_pretrained`` over every kind of
folder (:func:`lmlab.interop.folders.folder_kind`). Quantised, adapter and feature-run folders
load in compress, adapt and finetune, which is why this module sits above them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lmlab.interop.folders import adapter_folder, folder_kind, load_model
from lmlab.tokenization.characters import load_tokenizer
from lmlab.utils.catalog import resolve_model_dir
from lmlab.utils.errors import LmlabError


def from_pretrained(path: str | Path, head: str | list[str] | None = None, *,
                    allow_pickle: bool = False, dtype: torch.dtype | None = None):
    """Load a model from any model folder, a run directory, a ``.gguf`` file or a short name
    (``lmlab models list``).

    Args:
        head: ``None`` = the heads the checkpoint names; a name = that head, freshly
            initialised when the checkpoint lacks it (``model.fresh_heads``).
        allow_pickle: also read pickled ``.bin``/``.pt`` weights (unsafe for untrusted files).
    """
    path = resolve_model_dir(path)
    kind = folder_kind(path)
    if kind == "quantized":  # written by lmlab quantize: int8 layers, lmlab's format
        from lmlab.compress.quantize import load_quantized

        return load_quantized(path, head=head, dtype=dtype)
    if kind == "adapter":  # fine-tuned with --method: the adapter on its base model
        from lmlab.adapt import load_adapter

        model = load_adapter(adapter_folder(path))
        return model.to(dtype) if dtype is not None else model
    if kind == "feature-run":  # a feature-based fine-tuning run: encoder + feature head
        from lmlab.finetune.feature_based import load_feature_classifier

        return load_feature_classifier(path, head=head, dtype=dtype)
    return load_model(path, head=head, allow_pickle=allow_pickle, dtype=dtype)


def load_model_and_tokenizer(model: Any, tokenizer: Any = None, head: str | None = None,
                             dtype: torch.dtype | None = None, device: str | None = None):
    """Resolve ``model``/``tokenizer`` (paths or objects) into loaded, eval-mode objects."""
    source = None
    if isinstance(model, str | Path):
        source = resolve_model_dir(model)
        model = from_pretrained(source, head=head, dtype=dtype)
        if head is not None and head in getattr(model, "fresh_heads", []):
            raise LmlabError(
                f"{source} has no trained {head!r} head (its weights are not in the checkpoint)",
                f"use a checkpoint trained with that head (e.g. pretrained with --objective "
                f"{head}) or fine-tune one first",
            )
    elif dtype is not None:
        model = model.to(dtype)
    if tokenizer is None:
        if source is None:
            raise LmlabError("a loaded model was given without a tokenizer",
                             "pass tokenizer=... (an lmlab Tokenizer or a folder)")
        tokenizer = load_tokenizer(source)
    elif isinstance(tokenizer, str | Path):
        tokenizer = load_tokenizer(tokenizer)
    if device is not None:
        model = model.to(device)
    if tokenizer is not None and len(tokenizer) > model.config.vocab_size:
        raise LmlabError(
            f"the tokenizer has {len(tokenizer)} tokens but the model's vocabulary has "
            f"{model.config.vocab_size}: they do not belong together",
            "load the tokenizer saved with this model",
        )
    return model.eval(), tokenizer
