"""What kind of model folder a path is, by its marker files, and loading the plain kinds
(GGUF, recurrent, native, Hugging Face); wrapped kinds (quantised, adapter, feature run) load
through :func:`lmlab.load.from_pretrained`, on a floor above.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmlab.interop.native import is_native_folder
from lmlab.interop.recurrent import is_recurrent_folder
from lmlab.utils.catalog import resolve_model_dir
from lmlab.utils.errors import LmlabError

QUANTIZATION_FILE = "quantization.json"  # beside config.json: marks a quantised model folder
ADAPTER_CONFIG = "adapter.json"  # a PEFT adapter folder (lmlab.adapt)
FEATURE_HEAD_CONFIG = "feature_head.json"  # a feature-based fine-tuning run (finetune.feature_based)

#: what :func:`folder_kind` answers, and how each kind loads
KINDS = ("gguf", "quantized", "adapter", "feature-run", "recurrent", "native", "huggingface")
PLAIN_KINDS = ("gguf", "recurrent", "native", "huggingface")


def adapter_folder(path: str | Path) -> Path | None:
    """The folder holding ``adapter.json`` for ``path`` (itself, or a run's ``model/``)."""
    path = Path(path)
    for folder in (path, path / "model"):
        if (folder / ADAPTER_CONFIG).is_file():
            return folder
    return None


def plain_kind(path: str | Path) -> str:
    """The kind of model file under any wrapper: gguf, recurrent, native or huggingface."""
    path = Path(path)
    if path.suffix == ".gguf":
        return "gguf"
    if is_recurrent_folder(path):
        return "recurrent"
    return "native" if is_native_folder(path) else "huggingface"


def folder_kind(path: str | Path) -> str:
    """The kind (:data:`KINDS`) of a resolved model path: a wrapper's marker first, else
    :func:`plain_kind`."""
    path = Path(path)
    if path.suffix != ".gguf":
        if (path / QUANTIZATION_FILE).is_file():
            return "quantized"
        if adapter_folder(path) is not None:
            return "adapter"
        if (path / FEATURE_HEAD_CONFIG).exists():
            return "feature-run"
    return plain_kind(path)


def source_kind(source: str | Path) -> str | None:
    """The kind of a model source (folder, run directory, short name); None when it does not
    resolve (its loading then says what is wrong)."""
    try:
        return folder_kind(resolve_model_dir(source))
    except LmlabError:
        return None


def load_plain(path: str | Path, head: str | list[str] | None = None, *,
               allow_pickle: bool = False, dtype: Any = None):
    """The model file of folder ``path`` by its :func:`plain_kind`, whatever wraps it."""
    kind = plain_kind(path)
    if kind == "gguf":
        from lmlab.interop.gguf import load_gguf_model

        return load_gguf_model(path, dtype=dtype)
    if kind == "recurrent":
        from lmlab.interop.recurrent import load_recurrent

        return load_recurrent(path, head=head, dtype=dtype)
    if kind == "native":  # lmlab's own format: a config no Hugging Face family expresses
        from lmlab.interop.native import load_native

        return load_native(path, head=head, dtype=dtype)
    from lmlab.interop.hf import load_pretrained

    return load_pretrained(path, head=head, allow_pickle=allow_pickle, dtype=dtype)


def load_model(path: str | Path, head: str | list[str] | None = None, *,
               allow_pickle: bool = False, dtype: Any = None):
    """A model from a GGUF file or a recurrent, native or Hugging Face folder; wrapped kinds
    are refused with the loader that reads them."""
    path = resolve_model_dir(path)
    kind = folder_kind(path)
    if kind not in PLAIN_KINDS:
        raise LmlabError(f"{path} is a {kind} folder, which this step cannot start from",
                         "load it with lmlab.from_pretrained (it reads every kind of folder)")
    return load_plain(path, head=head, allow_pickle=allow_pickle, dtype=dtype)
