"""lmlab's recurrent model folder: build, save and load AWD-LSTM and ELMo models.

config.json holds the RecurrentConfig fields plus ``lmlab_recurrent`` (the family: the marker)
and ``heads``; ELMo's character table is a buffer in the weights, so it needs no tokenizer.
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
from lmlab.models.rnn.config import FORMAT_KEY, RecurrentConfig
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import config_has_key

HEADS_KEY = "heads"


def is_recurrent_folder(path: str | Path) -> bool:
    """Whether ``path`` holds a model in lmlab's recurrent format."""
    return config_has_key(path, FORMAT_KEY)


def is_recurrent_model(model: Any) -> bool:
    from lmlab.models.rnn.base import RecurrentModel

    return isinstance(model, RecurrentModel)


def build_model(config: RecurrentConfig, heads: Sequence[str] = (), tokenizer: Any = None,
                char_table: torch.Tensor | None = None):
    """A fresh model of ``config``'s family. ELMo reads characters: its table comes from
    ``char_table`` or the ``tokenizer``'s vocabulary (a model to be loaded gets it from the
    weights)."""
    from lmlab.models.rnn.awd_lstm import AWDLSTMModel
    from lmlab.models.rnn.elmo import ElmoModel

    if config.family == "awd-lstm":
        return AWDLSTMModel(config, heads)
    if char_table is None and tokenizer is not None:
        from lmlab.models.rnn.char_cnn import tokenizer_char_table

        char_table = tokenizer_char_table(tokenizer, config.max_chars)
    return ElmoModel(config, heads, char_table=char_table)


def read_recurrent_config(path: str | Path) -> tuple[RecurrentConfig, list[str]]:
    """The config and the saved heads' names of a recurrent folder."""
    values, family = read_state_config(path, FORMAT_KEY)
    heads = list(values.pop(HEADS_KEY, []))
    if values.get("family") != family:
        raise LmlabError(f"{path}/config.json names family {values.get('family')!r} but the "
                         f"format key says {family!r}", "the file was edited; re-save the model")
    return RecurrentConfig.from_dict(values), heads


def save_recurrent(model, path: str | Path) -> Path:
    """Write ``model`` (AWD-LSTM or ELMo) as ``config.json`` + ``model.safetensors``."""
    return write_state_folder(model, path, {
        **model.config.to_dict(), FORMAT_KEY: model.config.family,
        HEADS_KEY: list(model.heads.keys()),
        "model_type": "lmlab-recurrent"})  # no transformers class: transformers refuses it


def add_zero_softmax_bias(model, state: dict[str, torch.Tensor]) -> list[str]:
    """Give ``state`` a zero ``heads.<lm>.decoder.bias`` for each of ``model``'s LM heads that
    it lacks, in place; returns their names. Saved before the softmax had a bias, a model
    computed ``W h``, which a zero bias reproduces exactly."""
    from lmlab.models.rnn.base import LMHead

    added = []
    for name, head in model.heads.items():
        key = f"heads.{name}.decoder.bias"
        weight = state.get(f"heads.{name}.decoder.weight")
        if isinstance(head, LMHead) and key not in state and weight is not None:
            state[key] = torch.zeros(weight.shape[0], dtype=weight.dtype)
            added.append(key)
    return added


def load_recurrent(path: str | Path, head: str | Sequence[str] | None = None,
                   dtype: torch.dtype | None = None):
    """Load a recurrent folder. ``head``: None = the saved heads; a name or list = those heads,
    freshly initialised where the folder has none (listed in ``model.fresh_heads``)."""
    config, saved = read_recurrent_config(path)
    heads = saved if head is None else [head] if isinstance(head, str) else list(head)
    state = read_state(path, "a recurrent", heads)
    model = build_model(config, heads)
    add_zero_softmax_bias(model, state)  # a folder saved before the softmax had its bias
    model = load_checked(model, state, [name for name in heads if name not in saved],
                         f"{Path(path) / 'model.safetensors'} ({config.family})")
    return model.to(dtype) if dtype is not None else model
