"""A task as an Objective: lets :class:`lmlab.training.Trainer` fine-tune a model on a task.

It follows the pretraining objectives' interface (``prepare``, ``compute_loss`` returning an
``ObjectiveResult``), so the Trainer's loop, checkpoints and resumption work
unchanged with a :class:`lmlab.finetune.data.TaskStream` as the data stream.
"""

from __future__ import annotations

import torch
from torch import nn

from lmlab.models.task_heads import HEAD_FOR_TASK, MULTIPLE_CHOICE, add_task_head, task_logits
from lmlab.objectives.base import ObjectiveResult
from lmlab.utils.checks import check_choice


class TaskObjective(nn.Module):
    """Loss of the head of ``task_type`` (cross-entropy, MSE for regression, start/end CE for
    QA) over ``num_labels`` outputs (1 for regression, the tag set for tagging); ``id2label``
    goes into the saved config."""

    name = "task"
    flops_head = "none"  # task heads are small: the FLOP count is the stack's
    reports_perplexity = False
    predicted_fraction = None

    def __init__(self, task_type: str, num_labels: int, id2label: dict[int, str] | None = None,
                 pooling: str | None = None):
        super().__init__()
        check_choice(task_type, HEAD_FOR_TASK, "task type", "task type")
        self.task_type = task_type
        self.head = HEAD_FOR_TASK[task_type]
        self.head_names = (self.head,)
        self.num_labels = num_labels
        self.id2label = id2label
        self.pooling = pooling

    def prepare(self, model: nn.Module) -> None:
        """Add the task head when the model lacks it (or has one of another width); for
        tagging, also record in the config how word labels were put on sub-tokens."""
        width = None if self.head == MULTIPLE_CHOICE else self.num_labels
        if self.task_type == "qa":
            width = 2
        add_task_head(model, self.head, width, self.id2label, self.pooling,
                      "regression" if self.task_type == "regression" else None)
        if self.task_type == "tagging":  # saved in the config: the pipeline groups words alike
            from lmlab.finetune.data import WORD_LABELS

            model.config.extra["word_labels"] = WORD_LABELS

    def compute_loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> ObjectiveResult:
        logits = task_logits(model, self.head, batch)
        labels = batch["labels"]
        head = model.heads[self.head]
        loss = head.loss(logits, labels)
        metrics: dict[str, float] = {"loss": float(loss.detach())}
        count = int(labels.shape[0])
        if self.task_type == "tagging":
            keep = labels != -100
            count = int(keep.sum())
            if count:
                metrics["accuracy"] = float((logits.argmax(-1)[keep] == labels[keep]).float()
                                            .mean())
        elif self.task_type not in ("regression", "qa"):
            metrics["accuracy"] = float((logits.argmax(-1) == labels).float().mean())
        return ObjectiveResult(loss=loss, metrics=metrics, num_predictions=max(count, 1))
