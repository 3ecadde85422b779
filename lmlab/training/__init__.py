"""lmlab.training: the one training loop (pretraining, fine-tuning, decoders), its config,
schedules, checkpoints and scale-out. Names are imported lazily (torch on first use)."""

from __future__ import annotations

from typing import Any

_LAZY = {
    "Trainer": "lmlab.training.trainer:Trainer",
    "TrainResult": "lmlab.training.trainer:TrainResult",
    "TrainingConfig": "lmlab.training.config:TrainingConfig",
    "Schedule": "lmlab.training.schedules:Schedule",
    # the function is lmlab.pretrain: here the name ``pretrain`` is its module (importing a
    # submodule sets the package attribute, so a lazy function of that name would flip to it)
    "PretrainConfig": "lmlab.training.pretrain:PretrainConfig",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'lmlab.training' has no attribute {name!r}")
    from lmlab.utils.lazy import import_attribute

    value = globals()[name] = import_attribute(target)
    return value
