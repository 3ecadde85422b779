"""Unstructured magnitude pruning with a sparsity schedule, and the lottery ticket procedure.

The smallest weights of the Transformer layers' linear maps are zeroed, over all of them
(``scope="global"``) or per matrix (``"layer"``), at once or during training along Zhu & Gupta's
cubic schedule (:class:`MagnitudePruningHook`, through the Trainer's hooks). :func:`lottery_ticket`
trains, prunes, rewinds the survivors to step ``k`` and retrains (Frankle & Carbin 2019; Frankle
et al. 2020). See docs/pruning.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from lmlab.compress.settings import (
    PRUNE_FRACTION_FIX,
    REWIND_FIX,
    SPARSITY_FIX,
    check_fraction,
)
from lmlab.training.hooks import TrainerHook
from lmlab.utils.checks import check_at_least, check_choice
from lmlab.utils.errors import LmlabError

Scope = Literal["global", "layer"]
Schedule = Literal["cubic", "linear"]
SCOPES = ("global", "layer")
SCHEDULES = ("cubic", "linear")
MASKS_FILE = "pruning_masks.safetensors"


def prunable_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """The linear maps of the Transformer layers, by module name (what magnitude pruning
    sparsifies)."""
    transformer = getattr(model, "transformer", None)
    root = transformer if transformer is not None else model
    prefix = "transformer." if transformer is not None else ""
    found = {prefix + name: module for name, module in root.named_modules()
             if isinstance(module, nn.Linear) and ".layers." in f".{name}"}
    if not found:
        raise LmlabError(f"{type(model).__name__} has no Transformer layer with linear maps",
                         "prune a LanguageModel (an encoder or a decoder)")
    return found


def magnitude_masks(modules: dict[str, nn.Linear], sparsity: float, scope: Scope = "global",
                    current: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Boolean keep-masks (True = kept) that remove the ``sparsity`` fraction of smallest
    |weights|, over all ``modules`` (``"global"``) or in each (``"layer"``). Weights that
    ``current`` already removed stay removed (they rank lowest)."""
    check_fraction(sparsity, "sparsity", allow_zero=True, fix=SPARSITY_FIX)
    check_choice(scope, SCOPES, "scope", "pruning scope")
    scores = {}
    for name, module in modules.items():
        score = module.weight.detach().abs().float()
        if current is not None and name in current:
            score = score.masked_fill(~current[name].to(score.device), -1.0)
        scores[name] = score
    if scope == "layer":
        return {name: _keep_largest(score, sparsity) for name, score in scores.items()}
    flat = torch.cat([s.reshape(-1).cpu() for s in scores.values()])
    keep = _keep_largest(flat, sparsity)
    masks, offset = {}, 0
    for name, score in scores.items():
        masks[name] = keep[offset:offset + score.numel()].view_as(score).to(score.device)
        offset += score.numel()
    return masks


def _keep_largest(score: torch.Tensor, sparsity: float) -> torch.Tensor:
    """A mask keeping the ``1 - sparsity`` largest entries of ``score`` (exact count, ties
    broken by position)."""
    removed = int(round(sparsity * score.numel()))
    keep = torch.ones(score.numel(), dtype=torch.bool, device=score.device)
    if removed:
        keep[torch.argsort(score.reshape(-1), stable=True)[:removed]] = False
    return keep.view_as(score)


@torch.no_grad()
def apply_masks(modules: dict[str, nn.Linear], masks: dict[str, torch.Tensor]) -> None:
    """Zero the removed weights in place."""
    for name, mask in masks.items():
        weight = modules[name].weight
        weight.mul_(mask.to(device=weight.device, dtype=weight.dtype))


def sparsity_of(modules: dict[str, nn.Linear]) -> float:
    """Fraction of exactly-zero weights over ``modules``."""
    zeros = sum(int((m.weight == 0).sum()) for m in modules.values())
    return zeros / sum(m.weight.numel() for m in modules.values())


def sparsity_at(step: int, final: float, start: int, end: int, initial: float = 0.0,
                kind: Schedule = "cubic") -> float:
    """Zhu & Gupta's schedule: ``initial`` until ``start``, ``final`` from ``end`` on, between
    them ``final + (initial - final) * (1 - progress) ** 3`` (power 1 for ``linear``)."""
    check_choice(kind, SCHEDULES, "schedule", "sparsity schedule")
    if step < start:
        return initial
    if step >= end or end <= start:
        return final
    power = 3 if kind == "cubic" else 1
    return final + (initial - final) * (1 - (step - start) / (end - start)) ** power


class MaskHook(TrainerHook):
    """Keep fixed masks applied: after every optimizer step the removed weights are set back
    to 0 (the lottery ticket's retraining). The masks are saved in every checkpoint."""

    def __init__(self, model: nn.Module, masks: dict[str, torch.Tensor] | None = None):
        self.modules = prunable_linears(model)
        self.masks = dict(masks or {})

    def on_train_start(self, trainer) -> str | None:
        apply_masks(self.modules, self.masks)
        return None

    def on_step_end(self, trainer) -> str | None:
        apply_masks(self.modules, self.masks)
        return None

    def save(self, folder: Path) -> dict[str, Any]:
        from safetensors.torch import save_file

        if self.masks:
            save_file({k: v.to(torch.uint8).cpu().contiguous() for k, v in self.masks.items()},
                      str(Path(folder) / MASKS_FILE))
        return {"masks": bool(self.masks)}

    def load(self, folder: Path, state: dict[str, Any]) -> None:
        from safetensors.torch import load_file

        if state.get("masks"):
            self.masks = {k: v.bool() for k, v in load_file(str(Path(folder) / MASKS_FILE)).items()}


class MagnitudePruningHook(MaskHook):
    """Gradual magnitude pruning during training (Zhu & Gupta 2017): every ``every`` optimizer
    steps from ``start`` to ``end`` the masks are recomputed at :func:`sparsity_at` (a weight
    once removed stays removed); between updates the masks are re-applied after each step."""

    def __init__(self, model: nn.Module, final: float, start: int, end: int, every: int = 10,
                 scope: Scope = "global", kind: Schedule = "cubic", initial: float = 0.0):
        check_fraction(final, "sparsity", allow_zero=True, fix=SPARSITY_FIX)
        check_fraction(initial, "initial sparsity", allow_zero=True, fix=SPARSITY_FIX)
        if initial > final:  # the masks only grow: a removed weight is never restored
            raise LmlabError(f"initial sparsity {initial} is above the final {final}",
                             "give an initial sparsity at most the final one")
        if start < 0 or end < start or every < 1:
            raise LmlabError(f"pruning steps start={start}, end={end}, every={every}",
                             "use 0 <= start <= end and every >= 1")
        check_choice(kind, SCHEDULES, "schedule", "sparsity schedule")
        check_choice(scope, SCOPES, "scope", "pruning scope")
        super().__init__(model)
        self.final, self.start, self.end, self.every = final, start, end, every
        self.scope, self.kind, self.initial = scope, kind, initial
        self.history: list[tuple[int, float]] = []

    def on_step_end(self, trainer) -> str | None:
        step = trainer.step
        due = self.start <= step <= self.end and ((step - self.start) % self.every == 0
                                                  or step == self.end)
        if due or (step > self.end and not self.masks):
            target = sparsity_at(step, self.final, self.start, self.end, self.initial, self.kind)
            self.masks = magnitude_masks(self.modules, target, self.scope, self.masks or None)
            self.history.append((step, target))
        apply_masks(self.modules, self.masks)
        return None


class RewindPoint(TrainerHook):
    """Copy the model's weights at optimizer step ``step`` (0: before the first step)."""

    def __init__(self, model: nn.Module, step: int = 0):
        self.model, self.step = model, step
        self.state: dict[str, torch.Tensor] | None = None

    def _take(self) -> None:
        self.state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def on_train_start(self, trainer) -> str | None:
        if self.step == 0 and trainer.step == 0:
            self._take()
        return None

    def on_step_end(self, trainer) -> str | None:
        if trainer.step == self.step:
            self._take()
        return None


def lottery_ticket(model: nn.Module, train_fn: Callable[[nn.Module, Sequence[TrainerHook], int],
                                                       None],
                   evaluate_fn: Callable[[nn.Module], float], rounds: int,
                   prune_fraction: float = 0.2, rewind_step: int = 0, scope: Scope = "global",
                   on_round: Callable[[dict[str, Any]], None] | None = None
                   ) -> list[dict[str, Any]]:
    """Iterative magnitude pruning with rewinding; returns one row per round.

    Args:
        train_fn: ``(model, hooks, round) -> None`` trains ``model`` in place with the Trainer,
            passing ``hooks`` to it (they keep the masks applied and take the rewind point).
        evaluate_fn: the task metric of the trained model.
        rounds: pruning rounds after the first training (sparsity ``1 - (1 - p)^rounds`` at the
            end).
        prune_fraction: ``p``, the fraction of the surviving weights removed each round.
        rewind_step: ``k``, the optimizer step whose weights the survivors return to.
    """
    check_at_least(rounds, 1, "rounds")
    check_fraction(prune_fraction, "prune fraction", fix=PRUNE_FRACTION_FIX)
    check_at_least(rewind_step, 0, "rewind step", REWIND_FIX)
    modules = prunable_linears(model)
    rewind = RewindPoint(model, rewind_step)
    masks: dict[str, torch.Tensor] = {}
    rows = []
    for round_ in range(rounds + 1):
        hooks: list[TrainerHook] = [MaskHook(model, masks)]
        if round_ == 0:
            hooks.append(rewind)
        train_fn(model, hooks, round_)
        if rewind.state is None:
            raise LmlabError(f"training ended before step {rewind_step}, the rewind point",
                             "train for more steps or rewind to an earlier step")
        row = {"round": round_, "sparsity": sparsity_of(modules),
               "metric": float(evaluate_fn(model))}
        rows.append(row)
        if on_round is not None:
            on_round(row)
        if round_ == rounds:
            break
        target = 1 - (1 - prune_fraction) ** (round_ + 1)
        masks = magnitude_masks(modules, target, scope, masks or None)
        model.load_state_dict(rewind.state)
        apply_masks(modules, masks)
    return rows


# -- training on a task -----------------------------------------------------------------------
def train_on_task(model: nn.Module, tokenizer, task, out_dir: str | Path, steps: int,
                  hooks: Sequence[TrainerHook] = (), lr: float = 5e-5, batch_size: int = 32,
                  max_length: int = 128, seed: int = 0, max_train_examples: int | None = None,
                  progress: bool = False, device: str = "auto") -> None:
    """Fine-tune ``model`` (with its task head) on ``task`` for ``steps`` optimizer steps on the
    Trainer (AdamW, linear decay after 10% warm-up, BERT's settings), with ``hooks``."""
    from lmlab.finetune.recipes import Recipe
    from lmlab.finetune.train import RunOptions, plan_task, task_objective, train_task
    from lmlab.tasks.sampling import sample_examples
    from lmlab.training.checkpoint import latest_checkpoint
    from lmlab.training.trainer import seed_everything

    if steps < 1:
        raise LmlabError(f"{steps} training steps", "train for at least one step")
    if latest_checkpoint(Path(out_dir) / "checkpoints") is not None:
        raise LmlabError(f"{out_dir} holds a training checkpoint: the Trainer would resume it, "
                         "replacing the model given by that run's weights (and its masks)",
                         "train into a new folder")
    examples = task.split("train")
    if max_train_examples:
        examples = sample_examples(examples, max_train_examples)
    rec = Recipe("task", lr=lr, epochs=1, batch_size=batch_size, max_length=max_length)
    plan = plan_task(task, tokenizer, rec, seed, RunOptions(device=device, progress=progress),
                     steps=steps, examples=examples, eps=1e-6, log_every=max(1, steps // 10))
    objective = task_objective(task)
    objective.prepare(model)
    seed_everything(seed)
    train_task(plan, model, objective, out_dir, hooks=hooks, track_cost=False,
               measure_peak=False)


def task_metric(task, tokenizer, split: str = "dev", max_length: int = 128,
                max_examples: int | None = None) -> Callable[[nn.Module], float]:
    """``model -> the task's first metric on split`` (what the pruning curves plot), on at
    most ``max_examples`` examples of it (a stratified sample, the same for every call)."""
    from dataclasses import replace

    from lmlab.finetune.runner import predict
    from lmlab.tasks.sampling import sample_examples

    if max_examples:
        task = replace(task, splits={**task.splits,
                                     split: sample_examples(task.split(split), max_examples)})

    def evaluate(model: nn.Module) -> float:
        scores = task.evaluate(split, predict(model, tokenizer, task, split,
                                              max_length=max_length))
        return float(scores[task.metrics[0]])
    return evaluate
