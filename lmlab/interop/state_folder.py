"""lmlab's own folders (native and recurrent): ``config.json`` + a state-dict ``model.safetensors``
(tied tensors once, their aliases in the file's metadata), written and read back with checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmlab.formats.safetensors_io import load_state, save_state
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import atomic_path, atomic_write_json, read_json


def write_state_folder(model, path: str | Path, config: dict[str, Any]) -> Path:
    """Write ``model``'s state and ``config`` (config.json) into folder ``path``."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise LmlabError(f"{path} is a file", "give a folder to save the model in")
    path.mkdir(parents=True, exist_ok=True)
    with atomic_path(path / "model.safetensors") as tmp:  # never a half-written file
        save_state(model.state_dict(), tmp)
    atomic_write_json(path / "config.json", config)
    return path


def read_state_config(path: str | Path, marker: str) -> tuple[dict[str, Any], Any]:
    """config.json's values less ``model_type`` (absent before 2026-11) and the ``marker``
    key, whose value comes second."""
    values = read_json(Path(path) / "config.json")
    values.pop("model_type", None)
    return values, values.pop(marker)


def read_state(path: str | Path, what: str, heads: list[str]) -> dict:
    """The saved state of folder ``path``, less the tensors of heads not in ``heads``."""
    weights = Path(path) / "model.safetensors"
    if not weights.is_file():
        raise LmlabError(f"{path} has {what} config.json but no model.safetensors",
                         "copy the whole model folder, weights included")
    return {name: tensor for name, tensor in load_state(weights).items()
            if not name.startswith("heads.") or name.split(".")[1] in heads}


def load_checked(model, state: dict, fresh: list[str], where: str, optional: tuple = ()):
    """Load ``state`` into ``model`` (heads in ``fresh`` and parameters under ``optional``
    prefixes may be absent), refusing one that does not match; ties, records ``fresh_heads``
    and returns the model in eval mode."""
    ours = model.state_dict()
    missing = [name for name in ours if name not in state
               and not (name.startswith("heads.") and name.split(".")[1] in fresh)
               and not name.startswith(optional)]
    unexpected = [name for name in state if name not in ours]
    mismatched = [f"{name} {tuple(state[name].shape)} != {tuple(ours[name].shape)}"
                  for name in state if name in ours and state[name].shape != ours[name].shape]
    if missing or unexpected or mismatched:
        raise LmlabError(f"the weights in {where} do not match its config.json: missing "
                         f"{missing[:5]}, unexpected {unexpected[:5]}, mis-shaped {mismatched[:5]}",
                         "check that config.json belongs to these weights and that the folder "
                         "is complete")
    model.load_state_dict(state, strict=False)
    model.tie_weights()
    model.fresh_heads = fresh
    return model.eval()
