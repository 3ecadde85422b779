"""Trainer hooks: what a training stage (fine-tuning's per-epoch evaluation and early stopping,
ULMFiT's unfreezing, :mod:`lmlab.finetune.hooks`) adds to the one loop at fixed points. A hook's
state is saved in every checkpoint and restored on resumption, so a resumed run decides as an
uninterrupted one.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmlab.training.trainer import Trainer


class TrainerHook:
    """Base class: every method is optional (does nothing)."""

    def on_train_start(self, trainer: Trainer) -> str | None:
        """After set-up and resumption, before this session's first step; return a stop
        reason to end the run before it (e.g. it had stopped early before a restart)."""
        return None

    def on_step_start(self, trainer: Trainer) -> None:
        """Before each optimizer step (``trainer.step`` steps are done)."""

    def on_step_end(self, trainer: Trainer) -> str | None:
        """After each optimizer step; return a stop reason to end the run there."""
        return None

    def on_train_end(self, trainer: Trainer) -> None:
        """After the loop, before the final evaluation, checkpoint and model save."""

    def save(self, folder: Path) -> dict[str, Any]:
        """Write this hook's state into the checkpoint staging ``folder`` (files, e.g.
        safetensors) and return its JSON-able part (kept in ``state.json``)."""
        return {}

    def load(self, folder: Path, state: dict[str, Any]) -> None:
        """Restore what :meth:`save` wrote into the checkpoint ``folder`` and returned."""
