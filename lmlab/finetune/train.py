"""One way to train a model on a task, used by every task-training caller: fine-tuning (BERT,
ULMFiT, PEFT methods, distillation on a task), the feature recipe, magnitude pruning and the
lottery ticket's rounds.

:func:`plan_task` builds the training stream and the Trainer's :class:`TrainingConfig` from a
:class:`~lmlab.finetune.recipes.Recipe` before any model loads (so a run folder can be checked
first); :func:`train_task` runs the Trainer on them with the caller's model and objective, with
dev selection (:class:`~lmlab.finetune.hooks.DevSelection`) when given a dev scorer, and
returns a :class:`TaskRun`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from lmlab.finetune import data as fdata
from lmlab.finetune.objective import TaskObjective
from lmlab.finetune.recipes import Recipe, epochs_for
from lmlab.training.config import TrainingConfig
from lmlab.utils.errors import LmlabError

if TYPE_CHECKING:
    from lmlab.finetune.hooks import DevSelection
    from lmlab.tasks.types import Task
    from lmlab.training.hooks import TrainerHook
    from lmlab.training.trainer import Trainer, TrainResult


@dataclass(frozen=True)
class RunOptions:
    """How a run trains rather than what it learns: precision, device, time budget, checkpoint
    interval and progress display."""

    precision: str = "fp32"
    device: str = "auto"
    budget_seconds: float | None = None
    save_every: int | None = None  # optimizer steps; None: every epoch (every run's end)
    progress: bool = True
    activation_checkpointing: bool = False


@dataclass
class TaskPlan:
    """A task-training run before the model: its training batches and the Trainer's config
    (:func:`plan_task`; text-to-text training plans without a task or recipe, from its own
    config)."""

    task: Task | None
    rec: Recipe | None
    stream: Any  # a TaskStream (a FeatureStream of frozen features, a PairStream)
    config: TrainingConfig
    epochs: int | None = None

    @property
    def steps_per_epoch(self) -> int:
        return len(self.stream)

    @property
    def features(self) -> list[Any]:
        """The encoded training examples (the record's training-data hash reads them)."""
        return self.stream.features


@dataclass
class TaskRun:
    """A finished :func:`train_task`: the Trainer, its result and the dev selection (if any). A
    recipe hands it to :func:`lmlab.finetune.runner.finetune` with the trained model's
    ``predict(split)`` (predictions as ``task.evaluate`` takes them) and ``save(folder)``, and
    what its report adds (``extra``)."""

    trainer: Trainer
    result: TrainResult
    stream: Any
    selection: DevSelection | None = None
    predict: Callable[[str], list[Any]] | None = None
    save: Callable[[Path], None] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def report(self) -> dict[str, Any]:
        """What every recipe reports (:meth:`DevSelection.report`: history, best epoch, stop
        reason, steps, speed, device, cost), then ``extra``."""
        examples = self.stream.examples_seen()
        return {**self.selection.report(self.trainer, self.result, examples), **self.extra}

    @property
    def main(self) -> bool:
        """False on the torchrun ranks that neither score nor write."""
        return self.trainer.dist.is_main

    def __getitem__(self, key: str) -> Any:
        return self.report[key]


def task_objective(task: Task, pooling: str | None = None) -> TaskObjective:
    """The loss of ``task``'s head (its labels recorded in the saved config)."""
    if task.type == "regression":
        width = 1
    elif task.type in ("qa", "multiple-choice"):
        width = 2
    else:
        width = len(task.labels)
    names = dict(enumerate(task.labels)) if task.type not in ("regression", "qa") else None
    return TaskObjective(task.type, width, names, pooling=pooling)


def plan_task(task: Task, tokenizer: Any, rec: Recipe, seed: int,
              run: RunOptions = RunOptions(), *, steps: int | None = None,
              examples: Sequence[Any] | None = None, stream: Any = None, eps: float = 1e-8,
              log_every: int = 10) -> TaskPlan:
    """The training batches (``stream``, else ``examples`` or the train split encoded at
    ``rec.max_length``) and the config: ``steps`` optimizer steps, else ``rec``'s epochs (more
    to make ``rec.min_updates``); a checkpoint every epoch unless ``run.save_every``."""
    if stream is None and task.type == "image-classification":  # tokenizer: the processor
        from lmlab.finetune.images import ImageStream

        examples = task.split("train") if examples is None else examples
        stream = ImageStream(task, examples, tokenizer, rec.batch_size, seed=seed)
    if stream is None:
        examples = task.split("train") if examples is None else examples
        features = fdata.encode_examples(task, examples, tokenizer, rec.max_length,
                                         split="train")
        stream = fdata.TaskStream(features, rec.batch_size, fdata.pad_id_of(tokenizer), seed=seed)
    world = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun: ranks split each global batch
    sizes = sorted({len(batch) for batch in stream.epoch_batches(0)})
    if any(size % world for size in sizes):
        raise LmlabError(f"the batches hold {sizes} examples, which {world} processes cannot "
                         "share evenly", f"use a --batch-size and a training set size (e.g. "
                         f"--max-train-examples) that are multiples of {world}")
    epochs = epochs_for(rec, len(stream))
    total = steps or len(stream) * epochs
    config = TrainingConfig(
        lr=rec.lr, schedule=rec.schedule, warmup_fraction=rec.warmup_fraction,
        weight_decay=rec.weight_decay, eps=eps, clip_norm=rec.clip_norm, max_steps=total,
        budget_seconds=run.budget_seconds, batch_size=rec.batch_size, seq_len=rec.max_length,
        seed=seed, precision=run.precision, device=run.device, progress=run.progress,
        save_every=run.save_every or (steps or len(stream)), keep_last=1, log_every=log_every,
        activation_checkpointing=run.activation_checkpointing)
    return TaskPlan(task, rec, stream, config, epochs)


def train_task(plan: TaskPlan, model: nn.Module, objective: nn.Module, out_dir: str | Path, *,
               hooks: Sequence[TrainerHook] = (), evaluate_dev: Callable[[], dict] | None = None,
               stream: Any = None, save_model: bool = False, **trainer_options: Any) -> TaskRun:
    """Train ``model`` on ``plan`` with ``objective`` on the Trainer into ``out_dir`` (the
    caller saves the model, unless ``save_model``). With ``evaluate_dev``, dev is scored after
    every epoch, the best epoch's weights are kept and training stops after
    ``plan.rec.patience`` epochs without improvement (on the task's first metric). ``stream``
    replaces the plan's (one carrying a teacher's logits); ``trainer_options`` go to the Trainer
    (``param_groups``, ``record``, ``eval_batches``, ``tokenizer_dir``)."""
    from lmlab.finetune.hooks import DevSelection
    from lmlab.training.trainer import Trainer

    selection = None
    if evaluate_dev is not None:
        selection = DevSelection(evaluate_dev, plan.task.metrics[0], plan.rec.patience,
                                 plan.steps_per_epoch, model.state_dict, model.load_state_dict)
        hooks = [selection, *hooks]
    stream = plan.stream if stream is None else stream
    trainer = Trainer(model, objective, stream, plan.config, out_dir, hooks=hooks,
                      save_model=save_model, **trainer_options)
    result = trainer.train()
    model.eval()
    return TaskRun(trainer, result, stream, selection)
