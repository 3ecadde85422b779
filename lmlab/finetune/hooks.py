"""Fine-tuning's Trainer hooks: :class:`DevSelection` (dev scored every epoch, best weights
kept, early stopping; every recipe) and :class:`Unfreezing` (ULMFiT). Both depend only on the
step and checkpointed state, so a resumed run selects and stops as an uninterrupted one does;
under DDP rank 0 scores and every rank applies the same decision.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from lmlab.training.hooks import TrainerHook

if TYPE_CHECKING:
    from lmlab.training.trainer import Trainer, TrainResult

BEST_FILE = "dev-best.safetensors"


class DevSelection(TrainerHook):
    """Per-epoch dev evaluation, best-state selection and early stopping.

    Args:
        evaluate_dev: scores of the current weights on the dev split (``{metric: value}``,
            higher is better for ``metric``); called on rank 0 only. It must not consume the
            training RNG (evaluate in eval mode, no dropout), or resumed runs would differ.
        metric: the score that selects the best epoch (e.g. the task's first metric).
        patience: stop after this many epochs in a row without a better ``metric``.
        steps_per_epoch: optimizer steps per epoch (the stream's batches per epoch).
        state_of: the tensors to keep for the best epoch (e.g. ``model.state_dict``); they are
            copied to CPU.
        restore: puts a kept state back (e.g. ``model.load_state_dict``).

    After training, :attr:`history` holds one entry per evaluation (``epoch``, ``step``,
    ``train_loss``, ``dev_<metric>`` ...) and :attr:`best_epoch` the selected one (-1: none).
    """

    # what a checkpoint keeps besides the best weights (JSON in its state.json)
    STATE = ("history", "best_score", "best_epoch", "bad_epochs", "loss_sum", "loss_count",
             "last_evaluated", "selection_seconds")

    def __init__(self, evaluate_dev: Callable[[], dict[str, float]], metric: str, patience: int,
                 steps_per_epoch: int, state_of: Callable[[], dict[str, torch.Tensor]],
                 restore: Callable[[dict[str, torch.Tensor]], None]):
        self.evaluate_dev = evaluate_dev
        self.metric = metric
        self.patience = patience
        self.steps_per_epoch = steps_per_epoch
        self.state_of = state_of
        self.restore = restore
        self.history: list[dict[str, Any]] = []
        self.best_score = -math.inf
        self.best_epoch = -1
        self.best_state: dict[str, torch.Tensor] | None = None
        self.bad_epochs = 0
        self.loss_sum, self.loss_count = 0.0, 0
        self.last_evaluated = -1  # the step of the newest evaluation
        self.selection_seconds = 0.0
        self.loop_seconds = 0.0

    def _select(self, trainer: Trainer) -> str | None:
        """Score the current weights (rank 0), share the scores, keep the best; returns
        ``"early_stopping"`` when patience has run out."""
        from lmlab.training.distributed import broadcast_object

        started = time.perf_counter()
        scores = self.evaluate_dev() if trainer.dist.is_main else None
        scores = broadcast_object(scores, trainer.dist)
        epoch = -(-trainer.step // self.steps_per_epoch)  # a partial epoch counts as one
        self.history.append({"epoch": epoch, "step": trainer.step,
                             "train_loss": self.loss_sum / max(1, self.loss_count),
                             **{f"dev_{k}": v for k, v in scores.items()}})
        self.loss_sum, self.loss_count = 0.0, 0
        self.last_evaluated = trainer.step
        trainer.log_eval({f"eval_dev_{k}": v for k, v in scores.items()})  # report.md shows it
        if scores[self.metric] > self.best_score:
            self.best_score, self.best_epoch, self.bad_epochs = scores[self.metric], epoch, 0
            self.best_state = {k: v.detach().to("cpu", copy=True)
                               for k, v in self.state_of().items()}
        else:
            self.bad_epochs += 1
        self.selection_seconds += time.perf_counter() - started
        return "early_stopping" if self.bad_epochs >= self.patience else None

    def on_train_start(self, trainer: Trainer) -> str | None:
        """A resumed run that had stopped early stays stopped."""
        return "early_stopping" if self.bad_epochs >= self.patience else None

    def on_step_end(self, trainer: Trainer) -> str | None:
        if trainer.last_loss is not None:
            self.loss_sum += trainer.last_loss
            self.loss_count += 1
        if trainer.step % self.steps_per_epoch:
            return None
        return self._select(trainer)

    def on_train_end(self, trainer: Trainer) -> None:
        """Score a last partial epoch (a run stopped by its budget), then restore the best."""
        if trainer.step > 0 and self.last_evaluated != trainer.step:
            self._select(trainer)
        self.loop_seconds = trainer.elapsed()  # before the final checkpoint and reports
        if self.best_state is not None:
            self.restore(self.best_state)

    def report(self, trainer: Trainer, run: TrainResult, examples: int) -> dict[str, Any]:
        """What every recipe reports about its finished run: the dev history, the selected
        epoch, why training stopped (``epochs``, ``early_stopping``, ``budget``), the steps, the
        device, the cost, and ``examples`` training examples per second of the training loop
        alone (the dev evaluations are ``selection_seconds``)."""
        training = max(self.loop_seconds - self.selection_seconds, 1e-9)
        return {"history": self.history, "best_epoch": self.best_epoch,
                "stop_reason": "epochs" if run.stop_reason == "max_steps" else run.stop_reason,
                "steps": run.step, "selection_seconds": round(self.selection_seconds, 3),
                "train_examples_per_s": examples / training, "selected_by": f"dev {self.metric}",
                "device": str(trainer.device), "cost": run.cost}

    def save(self, folder: Path) -> dict[str, Any]:
        from lmlab.formats.safetensors_io import save_state

        if self.best_state is not None:
            save_state(self.best_state, folder / BEST_FILE)
        return {name: getattr(self, name) for name in self.STATE}

    def load(self, folder: Path, state: dict[str, Any]) -> None:
        from lmlab.formats.safetensors_io import load_state

        for name in self.STATE if state else ():
            setattr(self, name, state[name])
        best = folder / BEST_FILE
        self.best_state = load_state(best) if best.is_file() else None


class Unfreezing(TrainerHook):
    """ULMFiT's gradual unfreezing: during epoch k only the layer groups of depth <= k train;
    the last epoch trains every group, as the paper's last stage does, even when the model has
    more groups than the run has epochs (a one-epoch run trains the head alone). Frozen
    parameters get no gradient and AdamW skips them; all train again after the run.
    """

    def __init__(self, model: nn.Module, steps_per_epoch: int, epochs: int):
        from lmlab.finetune.recipes import layer_groups

        self.model = model
        self.steps_per_epoch = steps_per_epoch
        self.last_epoch = epochs - 1
        self.every_group = len(layer_groups(model))  # a depth that unfreezes them all

    def on_step_start(self, trainer: Trainer) -> None:
        from lmlab.finetune.recipes import unfreeze_to

        epoch = trainer.step // self.steps_per_epoch
        last = 0 < self.last_epoch <= epoch  # a one-epoch run keeps its head-only epoch
        unfreeze_to(self.model, self.every_group if last else epoch)  # cheap: flags only

    def on_train_end(self, trainer: Trainer) -> None:
        for parameter in self.model.parameters():
            parameter.requires_grad_(True)
