"""What every pipeline shares: loading a model + tokenizer from a path, device and dtype."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lmlab.utils.errors import LmlabError


def load_model_and_tokenizer(model: Any, tokenizer: Any = None, head: str | None = None,
                             dtype: torch.dtype | None = None, device: str | None = None):
    """Resolve ``model``/``tokenizer`` (paths or objects) into loaded, eval-mode objects."""
    from lmlab.models.auto import from_pretrained, resolve_model_dir
    from lmlab.tokenization.tokenizer import Tokenizer

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
        tokenizer = Tokenizer.from_pretrained(source)
    elif isinstance(tokenizer, str | Path):
        tokenizer = Tokenizer.from_pretrained(tokenizer)
    if device is not None:
        model = model.to(device)
    if tokenizer is not None and len(tokenizer) > model.config.vocab_size:
        raise LmlabError(
            f"the tokenizer has {len(tokenizer)} tokens but the model's vocabulary has "
            f"{model.config.vocab_size}: they do not belong together",
            "load the tokenizer saved with this model",
        )
    return model.eval(), tokenizer
