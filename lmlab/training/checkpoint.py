"""Checkpoints that resume a run exactly, written so a kill at any moment leaves a usable one:
``checkpoints/step-N/`` is assembled in ``step-N.tmp/``, fsynced and renamed. The layout and why
the optimizer is a ``torch.save`` file are in docs/training.md ("Checkpoints and exact resume").
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmlab.formats.safetensors_io import load_state, save_state
from lmlab.training.run_dir import list_checkpoints  # torch-free: resume checks read it
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import read_json


def load_into(module: nn.Module, state: dict[str, torch.Tensor], source: Path | str) -> None:
    """Load ``state`` into ``module`` strictly (then re-tie shared weights)."""
    missing, unexpected = module.load_state_dict(state, strict=False)
    if missing or unexpected:
        fix = "resume with the same model configuration and objective as the run"
        if not unexpected and all(k.startswith("heads.") and k.endswith(".decoder.bias")
                                  for k in missing):
            # a recurrent LM saved before its softmax had a bias: its optimizer state has one
            # tensor fewer, so the run cannot continue exactly, but its weights can seed one
            fix = ("the run predates the recurrent LM softmax's bias: start a new run from its "
                   "weights with `lmlab pretrain --init RUN --out NEW_RUN` (the bias starts at 0)")
        raise LmlabError(f"checkpoint {source} does not match the model: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}", fix)
    if hasattr(module, "tie_weights"):
        module.tie_weights()


def save_module(module: nn.Module, path: Path) -> None:
    """Write ``module``'s weights to ``path`` (safetensors)."""
    save_state(module.state_dict(), path)


def load_module(module: nn.Module, path: Path) -> None:
    """Load weights written by :func:`save_module` into ``module``."""
    load_into(module, load_state(path), path)


# -- RNG ------------------------------------------------------------------------------------------
def rng_state() -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(JSON-able python/numpy states, torch generator states)."""
    import numpy as np

    py = random.getstate()
    np_state = np.random.get_state()
    json_state = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]),
                  float(np_state[4])],
    }
    tensors = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for index, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda{index}"] = state
    return json_state, tensors


def set_rng_state(json_state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    import numpy as np

    version, internal, gauss = json_state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = json_state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(tensors["cpu"])
    if torch.cuda.is_available():
        cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("cuda"))]
        if cuda:
            torch.cuda.set_rng_state_all(cuda)


# -- files ----------------------------------------------------------------------------------------
def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    for child in path.iterdir():
        if child.is_file():
            with open(child, "rb+") as handle:
                os.fsync(handle.fileno())
    _fsync_dir(path)


def latest_checkpoint(checkpoints_dir: Path) -> Path | None:
    found = list_checkpoints(checkpoints_dir)
    return found[-1][1] if found else None


def staging_dir(checkpoints_dir: Path, step: int) -> Path:
    """The ``step-N.tmp`` folder a checkpoint is assembled in (created empty)."""
    checkpoints_dir.mkdir(parents=True, exist_ok=True)
    for child in checkpoints_dir.glob("*.tmp"):  # remains of a run killed mid-save
        shutil.rmtree(child, ignore_errors=True)
    tmp = checkpoints_dir / f"step-{step}.tmp"
    tmp.mkdir()
    return tmp


def write_rng(tmp: Path, rank: int) -> dict[str, Any]:
    """Write rank ``rank``'s torch generator states into ``tmp``; returns python/numpy states."""
    json_state, tensors = rng_state()
    torch.save(tensors, tmp / f"rng-rank{rank}.pt")
    return json_state


def write_checkpoint(tmp: Path, model_state: dict[str, torch.Tensor],
                     objective_state: dict[str, torch.Tensor], optimizer_state: dict[str, Any],
                     state: dict[str, Any]) -> None:
    """Write model, objective, optimizer and ``state`` into the staging folder ``tmp``."""
    save_state(model_state, tmp / "model.safetensors")
    if objective_state:
        save_state(objective_state, tmp / "objective.safetensors")
    torch.save(optimizer_state, tmp / "optimizer.pt")
    (tmp / "state.json").write_text(json.dumps(state, sort_keys=True) + "\n", encoding="utf-8")


def commit(tmp: Path, keep_last: int) -> Path:
    """fsync and rename ``step-N.tmp`` to ``step-N``; delete all but the last ``keep_last``."""
    _fsync_tree(tmp)
    final = tmp.with_name(tmp.name[: -len(".tmp")])
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    for _, old in list_checkpoints(final.parent)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def read_state(path: Path) -> dict[str, Any]:
    return read_json(path / "state.json")


def load_optimizer_state(path: Path) -> dict[str, Any]:
    return torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)


def restore_rng(path: Path, json_states: dict[str, Any], rank: int) -> None:
    """Set this process's generators to rank ``rank``'s states in checkpoint ``path`` (its
    ``rng-rankN.pt`` and state.json's ``rng``), or rank 0's when the run had fewer ranks."""
    if str(rank) not in json_states:
        rank = 0
    tensors = torch.load(path / f"rng-rank{rank}.pt", map_location="cpu", weights_only=True)
    set_rng_state(json_states[str(rank)], tensors)
