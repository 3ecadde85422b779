"""Trainer hooks: what a training stage adds to the one loop without a loop of its own.

Pretraining needs none. Fine-tuning adds per-epoch dev evaluation with best-state selection and
early stopping, and ULMFiT's gradual unfreezing (:mod:`lmlab.finetune.hooks`); distillation,
adapters and seq2seq fine-tuning add theirs the same way. A hook sees the
:class:`~lmlab.training.trainer.Trainer` (``trainer.step``, ``trainer.model``,
``trainer.last_loss``, ``trainer.dist``, ``trainer.elapsed()``; ``trainer.log_eval(scores)``
records its own evaluation in ``metrics.jsonl`` and the report) at fixed points of the loop:

- ``on_train_start``: after set-up and resumption, before the first step of this session; a
  returned string ends the run before any step (a resumed run that a hook had stopped);
- ``on_step_start``: before each optimizer step (``trainer.step`` steps are done);
- ``on_step_end``: after each optimizer step; a returned string stops the run with that reason
  (e.g. ``"early_stopping"``);
- ``on_train_end``: after the loop, before the final evaluation, checkpoint and model save
  (e.g. restore the best weights).

A hook with state saves it in every checkpoint (:meth:`TrainerHook.save`: files in the
checkpoint folder and a JSON-able dict stored in ``state.json``) and gets it back on resumption
(:meth:`TrainerHook.load`), so a resumed run makes the decisions an uninterrupted run makes.
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
