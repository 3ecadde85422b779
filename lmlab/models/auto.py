"""``lmlab.from_pretrained``: one entry point for every checkpoint kind lmlab reads."""

from __future__ import annotations

import importlib
from pathlib import Path

import torch

from lmlab.utils.errors import LmlabError


def resolve_model_dir(path: str | Path) -> Path:
    """A Hugging Face folder for ``path``: itself, or an lmlab run directory's ``model/``."""
    path = Path(path)
    if not path.exists():
        raise LmlabError(f"{path} does not exist",
                         "give the path of a model folder, an lmlab run directory or a .gguf file")
    # A run directory has its own config.json (the run's settings) beside model/.
    if path.is_dir() and (path / "model" / "config.json").exists() and (
            not (path / "config.json").exists() or (path / "metrics.jsonl").exists()):
        return path / "model"
    return path


def from_pretrained(path: str | Path, head: str | list[str] | None = None, *,
                    allow_pickle: bool = False, dtype: torch.dtype | None = None):
    """Load a model from a Hugging Face folder, an lmlab run directory or a GGUF file.

    Args:
        path: folder with config.json + model.safetensors (sharded too), a run dir, or ``.gguf``.
        head: ``None`` = the heads the checkpoint names in ``architectures`` (bare model if
            none); ``"mlm"``, ``"nsp"``, ``"rtd"``, ... = that head, freshly initialised when the
            checkpoint lacks it.
        allow_pickle: also read pickled ``.bin``/``.pt`` weights (unsafe for untrusted files).
        dtype: cast after loading (``torch.bfloat16`` for fast CPU inference).

    Example:
        >>> import lmlab
        >>> model = lmlab.from_pretrained("path/to/bert", head="mlm")
    """
    path = resolve_model_dir(path)
    if path.suffix == ".gguf":
        gguf = importlib.import_module("lmlab.interop.gguf")
        return gguf.load_gguf_model(path, dtype=dtype)
    from lmlab.interop.hf import load_pretrained

    return load_pretrained(path, head=head, allow_pickle=allow_pickle, dtype=dtype)
