"""lmlab's own model folder, for models no Hugging Face family can express.

A pre-norm BERT, a BERT with rotary positions or any other mix of the core's options has no
``config.json`` that transformers understands. Such a model is written as:

- ``config.json``: the :class:`~lmlab.models.config.TransformerConfig` fields plus
  ``lmlab_heads`` (the head names, in order) — the key that marks the folder as lmlab's own —
  and ``"model_type": "lmlab-native"``: transformers refuses a model type it does not know
  (without one, versions before 5 guessed a class from the folder's name);
- ``model.safetensors``: lmlab's parameter names, tied tensors once (their aliases in the file's
  metadata, as in training checkpoints).

:func:`save_model` picks the format (Hugging Face when the family maps the config, else this
one); :func:`lmlab.from_pretrained` reads both, so a model saved by a run or a fine-tuning job
loads in a new process whatever its shape.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from lmlab.models.config import TransformerConfig
from lmlab.utils.checks import refuse_adapted_checkpoint
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import atomic_path, atomic_write_json, config_has_key

HEADS_KEY = "lmlab_heads"
#: the model_type of lmlab's own folders: no transformers class, so transformers refuses them
MODEL_TYPE = "lmlab-native"


def is_native_folder(path: str | Path) -> bool:
    """Whether ``path`` holds a model in lmlab's own format (``lmlab_heads`` in config.json)."""
    return config_has_key(path, HEADS_KEY)


def read_native_config(path: str | Path) -> tuple[TransformerConfig, list[str]]:
    """The model config and the saved heads' names of an lmlab-format folder."""
    with open(Path(path) / "config.json", encoding="utf-8") as handle:
        values = json.load(handle)
    heads = list(values.pop(HEADS_KEY))
    values.pop("model_type", None)  # absent from folders saved before 2026-11
    return TransformerConfig.from_dict(values), heads  # id2label's keys read back as ints


def save_native(model, path: str | Path) -> Path:
    """Write ``model`` (a :class:`~lmlab.models.model.LanguageModel`) in lmlab's own format."""
    from lmlab.formats.safetensors_io import save_state

    refuse_adapted_checkpoint(model)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    with atomic_path(path / "model.safetensors") as tmp:  # never a half-written file
        save_state(model.state_dict(), tmp)
    config = model.config.to_dict()
    config[HEADS_KEY] = list(model.heads.keys())
    config["model_type"] = MODEL_TYPE
    atomic_write_json(path / "config.json", config)
    return path


def save_model(model, path: str | Path, **hf_options: Any) -> tuple[Path, str]:
    """The one saver: ``model`` as a Hugging Face folder when its family maps the config (with
    ``hf_options``: ``architecture``, ``max_shard_bytes``), else in lmlab's own format (recurrent
    models: lmlab's recurrent format). Returns (folder, ``"huggingface"`` or ``"lmlab"``)."""
    from lmlab.interop.hf import save_pretrained
    from lmlab.interop.recurrent import is_recurrent_model, save_recurrent

    refuse_adapted_checkpoint(model)
    if is_recurrent_model(model):  # AWD-LSTM, ELMo: no Hugging Face family
        return save_recurrent(model, path), "lmlab"
    try:
        return save_pretrained(model, path, **hf_options), "huggingface"
    except LmlabError as error:  # the refusal of an unmappable config, made before writing
        print(f"lmlab: no Hugging Face mapping for this model ({error.problem}); writing "
              "lmlab's own format (lmlab.from_pretrained reads it; transformers does not)",
              flush=True)
        return save_native(model, path), "lmlab"


def save_pretrained(model, path: str | Path, **hf_options: Any) -> Path:
    """``lmlab.save_pretrained(model, folder)``: :func:`save_model`, returning the folder."""
    return save_model(model, path, **hf_options)[0]


def load_native(path: str | Path, head: str | Sequence[str] | None = None,
                dtype: torch.dtype | None = None):
    """Load an lmlab-format folder.

    Args:
        head: ``None`` = the saved heads; a name or list = those heads, freshly initialised
            where the folder has none (listed in ``model.fresh_heads``).
        dtype: cast after loading.
    """
    from lmlab.formats.safetensors_io import load_state
    from lmlab.models.model import LanguageModel
    from lmlab.models.seq2seq import EncoderDecoderModel

    path = Path(path)
    config, saved_heads = read_native_config(path)
    weights = path / "model.safetensors"
    if not weights.is_file():
        raise LmlabError(f"{path} has an lmlab config.json but no model.safetensors",
                         "copy the whole model folder, weights included")
    state = load_state(weights)
    heads = saved_heads if head is None else [head] if isinstance(head, str) else list(head)
    model_class = EncoderDecoderModel if config.is_encoder_decoder else LanguageModel
    model = model_class(config, heads=heads,
                        with_pooler=any(name.startswith("pooler.") for name in state) or None)
    ours = model.state_dict()
    fresh = [name for name in heads if name not in saved_heads]
    state = {name: tensor for name, tensor in state.items()
             if not name.startswith("heads.") or name.split(".")[1] in heads}
    saved_pooler = any(name.startswith("pooler.") for name in state)
    missing = [name for name in ours if name not in state
               and not (name.startswith("heads.") and name.split(".")[1] in fresh)
               and not (name.startswith("pooler.") and not saved_pooler)]  # a new head's pooler
    unexpected = [name for name in state if name not in ours]
    mismatched = [f"{name} {tuple(state[name].shape)} != {tuple(ours[name].shape)}"
                  for name in state if name in ours and state[name].shape != ours[name].shape]
    if missing or unexpected or mismatched:
        raise LmlabError(f"the weights in {weights} do not match its config.json: missing "
                         f"{missing[:5]}, unexpected {unexpected[:5]}, mis-shaped {mismatched[:5]}",
                         "check that config.json belongs to these weights and the files are "
                         "complete")
    model.load_state_dict(state, strict=False)
    model.tie_weights()
    model.fresh_heads = fresh
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()
