"""lmlab's own model folder, for models no Hugging Face family can express (a pre-norm BERT,
rotary positions in an encoder, ...): config.json holds the TransformerConfig fields plus
``lmlab_heads`` (the marker) and ``model_type: lmlab-native`` (which transformers refuses);
model.safetensors lmlab's parameter names. :func:`save_model` picks the format (docs/models.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from lmlab.interop.state_folder import (
    load_checked,
    read_state,
    read_state_config,
    write_state_folder,
)
from lmlab.models.config import TransformerConfig
from lmlab.models.quantised import dequantized
from lmlab.utils.checks import refuse_adapted_checkpoint
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import config_has_key

HEADS_KEY = "lmlab_heads"
#: the model_type of lmlab's own folders: no transformers class, so transformers refuses them
MODEL_TYPE = "lmlab-native"


def is_native_folder(path: str | Path) -> bool:
    """Whether ``path`` holds a model in lmlab's own format (``lmlab_heads`` in config.json)."""
    return config_has_key(path, HEADS_KEY)


def read_native_config(path: str | Path) -> tuple[TransformerConfig, list[str]]:
    """The model config and the saved heads' names of an lmlab-format folder."""
    values, heads = read_state_config(path, HEADS_KEY)
    return TransformerConfig.from_dict(values), list(heads)  # id2label's keys read back as ints


def save_native(model, path: str | Path) -> Path:
    """Write ``model`` (a :class:`~lmlab.models.model.LanguageModel`) in lmlab's own format."""
    refuse_adapted_checkpoint(model)
    return write_state_folder(model, path, {**model.config.to_dict(),
                                            HEADS_KEY: list(model.heads.keys()),
                                            "model_type": MODEL_TYPE})


def save_model(model, path: str | Path, **hf_options: Any) -> tuple[Path, str]:
    """The one saver: ``model`` as a Hugging Face folder when its family maps the config (with
    ``hf_options``: ``architecture``, ``max_shard_bytes``), else in lmlab's own format (recurrent
    models: lmlab's recurrent format). Returns (folder, ``"huggingface"`` or ``"lmlab"``)."""
    from lmlab.interop.hf import save_pretrained
    from lmlab.interop.recurrent import is_recurrent_model, save_recurrent

    refuse_adapted_checkpoint(model)
    model = dequantized(model)  # block-quantised GGUF layers are written as float32
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
    """Load an lmlab-format folder. ``head``: None = the saved heads; a name or list = those
    heads, freshly initialised where the folder has none (``model.fresh_heads``)."""
    from lmlab.models.classes import build_model

    config, saved_heads = read_native_config(path)
    heads = saved_heads if head is None else [head] if isinstance(head, str) else list(head)
    state = read_state(path, "an lmlab", heads)
    saved_pooler = any(name.startswith("pooler.") for name in state)
    model = build_model(config, heads, state)
    model = load_checked(model, state, [name for name in heads if name not in saved_heads],
                         str(Path(path) / "model.safetensors"),
                         () if saved_pooler else ("pooler.",))  # a new head's pooler
    return model.to(dtype) if dtype is not None else model
