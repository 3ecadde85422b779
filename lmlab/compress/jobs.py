"""Whole compression jobs, as ``lmlab compress prune-heads | magnitude | lottery | low-rank``
runs them: on a loaded model, tokenizer and task, each writes its rows, curve and compressed
model with :meth:`JobSettings.write` (docs/pruning.md).

The settings are typed and checked when they are made; this module imports torch only inside
the jobs, so a command refuses bad settings before torch loads.
"""

from __future__ import annotations

import copy
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmlab.compress.settings import (
    HeadPruning,
    Lottery,
    LowRank,
    MagnitudePruning,
)
from lmlab.utils.checks import check_at_least
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import atomic_write_json, atomic_write_text

Log = Callable[[str], None]


def _print(line: str) -> None:
    print(line, flush=True)


@dataclass(frozen=True)
class JobSettings:
    """What every job shares: where it writes, how the task's metric is measured (the first
    metric on ``eval_split``, on ``eval_examples`` of it: a stratified sample, the same at every
    step) and how the model trains when a job trains it."""

    out: Path
    source: str  # the model as named by the user (results.json's "model")
    command: str = ""  # the command line, recorded in results.json
    eval_split: str = "dev"
    eval_examples: int | None = None
    max_length: int = 128
    lr: float = 5e-5
    batch_size: int = 32
    max_train_examples: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        check_at_least(self.eval_examples, 1, "--eval-examples")

    def train(self, model, tokenizer, task, folder: str, steps: int, hooks=(),
              progress: bool = False) -> None:
        """Fine-tune on the task into ``out/folder``, emptied first: under --overwrite an
        earlier run's checkpoint there would be resumed (train_on_task refuses one)."""
        from lmlab.compress.magnitude import train_on_task

        shutil.rmtree(self.out / folder, ignore_errors=True)
        train_on_task(model, tokenizer, task, self.out / folder, steps, hooks, lr=self.lr,
                      batch_size=self.batch_size, max_length=self.max_length, seed=self.seed,
                      max_train_examples=self.max_train_examples, progress=progress)

    def metric(self, task, tokenizer) -> Callable[[Any], float]:
        from lmlab.compress import magnitude

        return magnitude.task_metric(task, tokenizer, self.eval_split, self.max_length,
                                     self.eval_examples)

    def results(self, title: str, task=None, **values) -> dict[str, Any]:
        """results.json's fields: the title, model, host and command, then for a job measured
        on ``task`` its name, metric and split, then ``values``."""
        from lmlab.utils.host import describe_host

        measured = {} if task is None else {"task": task.name, "metric": task.metrics[0],
                                            "split": self.eval_split}
        return {"title": title, "model": self.source, "host": describe_host(),
                "command": self.command, **measured, **values}

    def write(self, results: dict, rows: list[dict], columns: list[tuple[str, str]], model,
              tokenizer, x: str | None = None, xlabel: str = "weights removed (%)",
              title: str | None = None) -> list[Path]:
        """results.json, results.md (a table of ``rows``; ``columns``: key, header), the curve
        of the task's metric against ``x`` (when given and there are two rows or more; titled
        ``title``, default the results' title) and the model with its tokenizer."""
        from lmlab.interop.native import save_model

        self.out.mkdir(parents=True, exist_ok=True)
        written = [self.out / "results.json", self.out / "results.md"]
        lines = [f"# {results['title']}", "",
                 f"model: `{results['model']}`; host: {results['host']}", "",
                 "| " + " | ".join(h for _, h in columns) + " |",
                 "|" + "---:|" * len(columns)]
        for row in rows:
            lines.append("| " + " | ".join(_cell(row.get(k)) for k, _ in columns) + " |")
        atomic_write_text(written[1], "\n".join(lines) + "\n")
        if x is not None and len(rows) > 1:
            written.append(self.out / "curve.png")
            _plot_curve(rows, x, written[-1], xlabel, f"{self.eval_split} {results['metric']}",
                        title or results["title"])
        folder, results["model_format"] = save_model(model, self.out / "model")
        tokenizer.save_pretrained(folder)
        atomic_write_json(written[0], results)
        written.append(folder)
        return written


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    return "" if value is None else str(value)


def _plot_curve(rows: list[dict[str, Any]], x: str, path: Path, xlabel: str, ylabel: str,
                title: str) -> None:
    """The metric against ``x`` (as a percentage); a long title (a model's full path) is
    wrapped to the figure's width rather than cut off."""
    import textwrap

    from lmlab.training.report import pyplot, save_png

    figure, axis = pyplot().subplots(figsize=(5.5, 3.6))
    axis.plot([100 * r[x] for r in rows], [r["metric"] for r in rows], marker="o")
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.set_title("\n".join(textwrap.wrap(title, 60)), fontsize=10)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    save_png(figure, path, dpi=120)


def has_head(model, task) -> bool:
    """Whether ``model`` carries a head for ``task`` (one for another task is refused)."""
    from lmlab.finetune.runner import check_head_matches
    from lmlab.models.task_heads import HEAD_FOR_TASK

    if HEAD_FOR_TASK[task.type] not in model.heads:
        return False
    check_head_matches(model, task)
    return True


def prune_heads_job(model, tokenizer, task, job: JobSettings, settings: HeadPruning,
                    log: Log = _print) -> list[Path]:
    """Remove heads in order of importance, measuring the task after each step; writes the
    curve and the model at ``max_fraction``. Returns the files written."""
    from lmlab.compress.heads import (
        attention_modules,
        head_importance,
        iterative_head_pruning,
        task_batches,
        task_loss,
    )

    attention_modules(model)  # refuse a model whose heads cannot be pruned, before training
    if not has_head(model, task):
        if not settings.finetune_steps:
            raise LmlabError(f"{job.source} has no head for the task {task.name}: the heads "
                             "would be scored against a random classifier",
                             "fine-tune it first (lmlab finetune) or add --finetune-steps N")
        job.train(model, tokenizer, task, "finetune", settings.finetune_steps, progress=True)
    batches = task_batches(task, tokenizer, settings.importance_split,
                           settings.importance_examples, max_length=job.max_length)
    loss = task_loss(task)
    metric = task.metrics[0]

    def show(row):
        log(f"removed {row['heads_removed']:3d} heads ({100 * row['fraction_removed']:.0f}%): "
            f"{metric} {row['metric']:.4f}")

    rows = iterative_head_pruning(model, lambda m: head_importance(m, batches, loss),
                                  job.metric(task, tokenizer), settings.step,
                                  settings.max_fraction, recompute=settings.recompute,
                                  on_step=show)
    results = job.results(f"Head pruning on {task.name}", task,
                          eval_examples=job.eval_examples, steps=rows,
                          finetune_steps=settings.finetune_steps)
    return job.write(results, rows, [
        ("heads_removed", "heads removed"), ("fraction_removed", "fraction"),
        ("metric", f"{job.eval_split} {metric}"), ("parameters", "parameters"),
        ("heads_per_layer", "heads per layer")], model, tokenizer, "fraction_removed",
        "attention heads removed (%)", f"{job.source} on {task.name}: iterative head pruning")


def magnitude_job(model, tokenizer, task, job: JobSettings, settings: MagnitudePruning,
                  log: Log = _print) -> list[Path]:
    """Prune a copy of ``model`` to each sparsity and measure it; writes the curve and the
    model of the last sparsity. Returns the files written."""
    from lmlab.compress.magnitude import (
        MagnitudePruningHook,
        apply_masks,
        magnitude_masks,
        prunable_linears,
        sparsity_of,
    )

    steps = settings.steps
    if not steps and not has_head(model, task):
        raise LmlabError(f"{job.source} has no head for the task {task.name}; one-shot pruning "
                         "(--steps 0) needs a fine-tuned model",
                         "fine-tune it first (lmlab finetune), or prune while fine-tuning "
                         "(--steps N)")
    evaluate = job.metric(task, tokenizer)
    rows, pruned = [], model
    for index, target in enumerate(settings.sparsities):
        pruned = copy.deepcopy(model)
        if steps:
            hook = MagnitudePruningHook(pruned, target, start=steps // 10,
                                        end=max(steps // 10, (7 * steps) // 10),
                                        every=settings.every, scope=settings.scope,
                                        kind=settings.schedule)
            job.train(pruned, tokenizer, task, f"train-{index}", steps, [hook])
        else:
            modules = prunable_linears(pruned)
            apply_masks(modules, magnitude_masks(modules, target, settings.scope))
        row = {"target": target, "sparsity": sparsity_of(prunable_linears(pruned)),
               "metric": evaluate(pruned)}
        log(f"sparsity {row['sparsity']:.3f}: {task.metrics[0]} {row['metric']:.4f}")
        rows.append(row)
    how = f"{steps} steps, {settings.schedule} schedule" if steps else "one shot"
    results = job.results(f"Magnitude pruning on {task.name} ({settings.scope}, {how})", task,
                          scope=settings.scope, schedule=settings.schedule, steps=steps,
                          rows=rows)
    return job.write(results, rows, [
        ("target", "target sparsity"), ("sparsity", "sparsity"),
        ("metric", f"{job.eval_split} {task.metrics[0]}")], pruned, tokenizer, "sparsity")


def lottery_job(model, tokenizer, task, job: JobSettings, settings: Lottery,
                log: Log = _print) -> list[Path]:
    """Run the rounds on ``model`` (left pruned at the last round's sparsity) and write the
    accuracy against sparsity. Returns the files written."""
    from lmlab.compress.magnitude import lottery_ticket


    def train(m, hooks, round_):
        job.train(m, tokenizer, task, f"round-{round_}", settings.steps, hooks)

    def show(row):
        log(f"round {row['round']}: sparsity {row['sparsity']:.3f}, {task.metrics[0]} "
            f"{row['metric']:.4f}")

    rows = lottery_ticket(model, train, job.metric(task, tokenizer), settings.rounds,
                          settings.prune_fraction, settings.rewind_step, settings.scope, show)
    results = job.results(f"Lottery ticket on {task.name} (rewind to step "
                          f"{settings.rewind_step}, {settings.prune_fraction:.0%} per round)",
                          task, rounds=rows, steps_per_round=settings.steps)
    return job.write(results, rows, [
        ("round", "round"), ("sparsity", "sparsity"),
        ("metric", f"{job.eval_split} {task.metrics[0]}")], model, tokenizer, "sparsity")


def low_rank_job(model, tokenizer, job: JobSettings, settings: LowRank, task=None,
                 log: Log = _print) -> list[Path]:
    """Factorise ``model`` in place, measuring ``task`` (when given) before and after; logs
    the summary (weights and FLOPs removed, reconstruction error) and writes it with the
    per-matrix table and the model. Returns the files written."""
    from lmlab.compress.lowrank import low_rank, select_linears, summary

    modules = list(settings.modules) if settings.modules else None
    select_linears(model, modules)  # refuse unknown names before the first evaluation
    evaluate = before = None
    if task is not None:
        if not has_head(model, task):
            raise LmlabError(f"{job.source} has no head for the task {task.name}",
                             "fine-tune it first (lmlab finetune), or leave out --task")
        evaluate = job.metric(task, tokenizer)
        before = evaluate(model)
    rows = low_rank(model, rank=settings.rank, energy=settings.energy, modules=modules)
    report = summary(rows, model)
    if evaluate is not None:
        report.update(metric_before=before, metric_after=evaluate(model),
                      metric=task.metrics[0])
    for key, value in report.items():
        log(f"{key}: {value}")
    table = [r.to_dict() for r in rows]
    results = job.results("Low-rank factorisation (truncated SVD)", rank=settings.rank,
                          energy=settings.energy, summary=report, modules=table)
    return job.write(results, table, [
        ("name", "module"), ("in_features", "in"), ("out_features", "out"), ("rank", "rank"),
        ("parameters_before", "weights before"), ("parameters_after", "weights after"),
        ("relative_error", "relative error"), ("energy", "energy kept")], model, tokenizer)
