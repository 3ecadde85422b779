"""``lmlab.from_pretrained``: one entry point for every checkpoint kind lmlab reads."""

from __future__ import annotations

import importlib
from pathlib import Path

import torch

from lmlab.utils.errors import LmlabError


def resolve_model_dir(path: str | Path) -> Path:
    """A Hugging Face folder for ``path``: itself, an lmlab run directory's ``model/``, or the
    checkpoint an offline short name (``minilm``, ``smollm2``) stands for."""
    from lmlab.utils.catalog import CATALOG, resolve_short_name

    path = resolve_short_name(path)
    if not path.exists() and any(ch in str(path) for ch in "*?["):
        import glob

        matches = sorted(glob.glob(str(path)))
        raise LmlabError(f"{path} does not exist: model paths are taken literally, not as globs",
                         f"give one folder, e.g. {matches[-1]}" if matches else
                         "give the path of one model folder, run directory or .gguf file")
    if not path.exists():
        raise LmlabError(f"{path} does not exist",
                         "give the path of a model folder, an lmlab run directory or a .gguf "
                         f"file, or a short name ({', '.join(CATALOG)}; `lmlab models list`)")
    seeds = sorted(path.glob("seed-*/model")) if path.is_dir() else []
    if seeds and not (path / "config.json").exists():
        raise LmlabError(f"{path} is a fine-tuning run with several seeds (seed-N/), not one "
                         "model", f"load one seed's model, e.g. {seeds[0].parent} (`lmlab "
                         "evaluate` scores every seed)")
    # A run directory has its own config.json (the run's settings) beside model/.
    if path.is_dir() and (path / "model" / "config.json").exists() and (
            not (path / "config.json").exists() or (path / "metrics.jsonl").exists()):
        return path / "model"
    return path


def from_pretrained(path: str | Path, head: str | list[str] | None = None, *,
                    allow_pickle: bool = False, dtype: torch.dtype | None = None):
    """Load a model from a Hugging Face folder, an lmlab run directory or a GGUF file.

    Args:
        path: folder with config.json + model.safetensors (sharded too), a run dir, ``.gguf``,
            or a short name from ``lmlab models list`` (``"minilm"``, ``"smollm2"``).
        head: ``None`` = the heads the checkpoint names in ``architectures`` (bare model if
            none); ``"mlm"``, ``"nsp"``, ``"rtd"``, ... = that head, freshly initialised when the
            checkpoint lacks it. A feature-based fine-tuning run (``feature_head.json``) loads
            as a :class:`~lmlab.finetune.feature_based.FeatureClassifier`.
        allow_pickle: also read pickled ``.bin``/``.pt`` weights (unsafe for untrusted files).
        dtype: cast after loading (``torch.bfloat16`` for fast CPU inference).

    Example:
        >>> import lmlab
        >>> model = lmlab.from_pretrained("minilm", head="mlm")
    """
    path = resolve_model_dir(path)
    if path.suffix == ".gguf":
        gguf = importlib.import_module("lmlab.interop.gguf")
        return gguf.load_gguf_model(path, dtype=dtype)
    from lmlab.compress.quantize import is_quantized_folder, load_quantized

    if is_quantized_folder(path):  # written by lmlab quantize: int8 layers, lmlab's format
        return load_quantized(path, head=head, dtype=dtype)
    from lmlab.adapt import adapter_folder, load_adapter

    adapted = adapter_folder(path)
    if adapted is not None:  # fine-tuned with --method: the adapter on its base model
        model = load_adapter(adapted)
        return model.to(dtype) if dtype is not None else model
    from lmlab.finetune.feature_based import is_feature_run, load_feature_classifier

    if is_feature_run(path):  # a feature-based fine-tuning run: encoder + feature head
        return load_feature_classifier(path, head=head, dtype=dtype)
    from lmlab.models.rnn.io import is_recurrent_folder, load_recurrent

    if is_recurrent_folder(path):  # AWD-LSTM, ELMo: lmlab's recurrent format
        return load_recurrent(path, head=head, dtype=dtype)
    from lmlab.interop.hf import load_pretrained

    return load_pretrained(path, head=head, allow_pickle=allow_pickle, dtype=dtype)
