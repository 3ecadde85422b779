"""lmlab's recurrent model folder: build, save and load AWD-LSTM and ELMo models.

A folder holds ``config.json`` (the :class:`~lmlab.models.rnn.config.RecurrentConfig` fields
plus ``lmlab_recurrent``: the family, the key that marks the format, and ``lmlab_heads``'s
counterpart ``heads``) and ``model.safetensors`` (tied tensors once, their aliases in the
file's metadata, as lmlab's checkpoints). ELMo's character table is a buffer in the weights,
so a saved ELMo needs no tokenizer to run. :func:`lmlab.from_pretrained` and
:func:`lmlab.interop.native.save_model` dispatch here, so a run's ``model/`` and a fine-tuned
classifier load in a new process like any other lmlab model.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from lmlab.models.rnn.config import FORMAT_KEY, RecurrentConfig
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import atomic_path, atomic_write_json, config_has_key

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
    with open(Path(path) / "config.json", encoding="utf-8") as handle:
        values = json.load(handle)
    family = values.pop(FORMAT_KEY)
    heads = list(values.pop(HEADS_KEY, []))
    values.pop("model_type", None)  # absent from folders saved before 2026-11
    if values.get("family") != family:
        raise LmlabError(f"{path}/config.json names family {values.get('family')!r} but the "
                         f"format key says {family!r}", "the file was edited; re-save the model")
    return RecurrentConfig.from_dict(values), heads


def save_recurrent(model, path: str | Path) -> Path:
    """Write ``model`` (AWD-LSTM or ELMo) as ``config.json`` + ``model.safetensors``."""
    from lmlab.formats.safetensors_io import save_state

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise LmlabError(f"{path} is a file", "give a folder to save the model in")
    path.mkdir(parents=True, exist_ok=True)
    with atomic_path(path / "model.safetensors") as tmp:
        save_state(model.state_dict(), tmp)
    config = model.config.to_dict()
    config[FORMAT_KEY] = model.config.family
    config[HEADS_KEY] = list(model.heads.keys())
    config["model_type"] = "lmlab-recurrent"  # no transformers class: transformers refuses it
    atomic_write_json(path / "config.json", config)
    return path


def add_zero_softmax_bias(model, state: dict[str, torch.Tensor]) -> list[str]:
    """Give ``state`` a zero ``heads.<lm>.decoder.bias`` for each of ``model``'s LM heads that
    it lacks, in place; returns their names. Folders and runs saved before the recurrent
    softmax had its bias computed ``W h``, which a zero bias reproduces exactly, so they load
    as they ran instead of being refused (or given a random bias)."""
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
    from lmlab.formats.safetensors_io import load_state

    path = Path(path)
    config, saved = read_recurrent_config(path)
    weights = path / "model.safetensors"
    if not weights.is_file():
        raise LmlabError(f"{path} has a recurrent config.json but no model.safetensors",
                         "copy the whole model folder, weights included")
    heads = saved if head is None else [head] if isinstance(head, str) else list(head)
    model = build_model(config, heads)
    state = {name: tensor for name, tensor in load_state(weights).items()
             if not name.startswith("heads.") or name.split(".")[1] in heads}
    add_zero_softmax_bias(model, state)  # a folder saved before the softmax had its bias
    ours = model.state_dict()
    fresh = [name for name in heads if name not in saved]
    missing = [name for name in ours if name not in state
               and not (name.startswith("heads.") and name.split(".")[1] in fresh)]
    unexpected = [name for name in state if name not in ours]
    mismatched = [f"{name} {tuple(state[name].shape)} != {tuple(ours[name].shape)}"
                  for name in state if name in ours and state[name].shape != ours[name].shape]
    if missing or unexpected or mismatched:
        raise LmlabError(f"the weights in {weights} do not match its config.json "
                         f"({config.family}): missing {missing[:4]}, unexpected {unexpected[:4]}, "
                         f"mis-shaped {mismatched[:4]}", "check that config.json belongs to "
                         "these weights and that the folder is complete")
    model.load_state_dict(state, strict=False)
    model.tie_weights()
    model.fresh_heads = fresh
    model.eval()
    return model.to(dtype) if dtype is not None else model
