"""The GLUE benchmark's metrics per task and the two ways papers summarise them in one number.

* :func:`glue_score` - the official leaderboard score (gluebenchmark.com): the unweighted mean of
  nine task scores. A task with two metrics (MRPC and QQP: F1 and accuracy; STS-B: Pearson and
  Spearman) scores the mean of the two; MNLI is one task whose score is the mean of its matched
  and mismatched accuracies. The diagnostic set AX is not part of the score. Check: BERT-large's
  leaderboard row (CoLA 60.5, SST-2 94.9, MRPC 89.3/85.4, STS-B 87.6/86.5, QQP 72.1/89.3,
  MNLI 86.7/85.9, QNLI 92.7, RTE 70.1, WNLI 65.1) gives 80.5, the "GLUE score 80.5" of the
  BERT abstract.
* :func:`bert_glue_average` - the "Average" column of the BERT paper's Table 1: WNLI is
  excluded (the paper: every submitted system did worse than the majority baseline), one
  metric per task (F1 for QQP and MRPC, Spearman for STS-B, accuracy or MCC elsewhere), and
  MNLI-m and MNLI-mm are two separate entries: the mean of 9 numbers. Check: BERT-base
  84.6, 83.4, 71.2, 90.5, 93.5, 52.1, 85.8, 88.9, 66.4 -> 79.6; BERT-large -> 82.1.

Results are passed as ``{task: {metric: value}}`` with the task keys of :data:`GLUE_TASKS`
(``"mnli-m"`` and ``"mnli-mm"`` separately). Any scale works (fractions or percentages) as
long as it is the same for every task.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from lmlab.utils.errors import LmlabError


@dataclass(frozen=True)
class GlueTaskMetrics:
    """One row of the GLUE metric table."""

    key: str
    name: str
    metrics: tuple[str, ...]  # all metrics the leaderboard reports, in its order
    bert_metric: str | None  # the single metric in the BERT paper's average (None: excluded)


GLUE_TASKS: dict[str, GlueTaskMetrics] = {
    row.key: row
    for row in (
        GlueTaskMetrics("cola", "CoLA", ("mcc",), "mcc"),
        GlueTaskMetrics("sst2", "SST-2", ("accuracy",), "accuracy"),
        GlueTaskMetrics("mrpc", "MRPC", ("f1", "accuracy"), "f1"),
        GlueTaskMetrics("stsb", "STS-B", ("pearson", "spearman"), "spearman"),
        GlueTaskMetrics("qqp", "QQP", ("f1", "accuracy"), "f1"),
        GlueTaskMetrics("mnli-m", "MNLI-m", ("accuracy",), "accuracy"),
        GlueTaskMetrics("mnli-mm", "MNLI-mm", ("accuracy",), "accuracy"),
        GlueTaskMetrics("qnli", "QNLI", ("accuracy",), "accuracy"),
        GlueTaskMetrics("rte", "RTE", ("accuracy",), "accuracy"),
        GlueTaskMetrics("wnli", "WNLI", ("accuracy",), None),
    )
}

# The nine leaderboard tasks; MNLI's score is the mean of its two evaluation sets.
LEADERBOARD_TASKS: dict[str, tuple[str, ...]] = {
    "cola": ("cola",), "sst2": ("sst2",), "mrpc": ("mrpc",), "stsb": ("stsb",),
    "qqp": ("qqp",), "mnli": ("mnli-m", "mnli-mm"), "qnli": ("qnli",), "rte": ("rte",),
    "wnli": ("wnli",),
}


def _metric(results: Mapping[str, Mapping[str, float]], task: str, metric: str) -> float:
    if task not in results:
        raise LmlabError(f"GLUE results have no entry for {task!r} (have: {sorted(results)})",
                         f"evaluate {GLUE_TASKS[task].name} or pass partial=True")
    if metric not in results[task]:
        raise LmlabError(f"GLUE results for {task!r} have no {metric!r} "
                         f"(have: {sorted(results[task])})",
                         f"report {', '.join(GLUE_TASKS[task].metrics)} for {task}")
    return float(results[task][metric])


def glue_task_score(results: Mapping[str, Mapping[str, float]], task: str) -> float:
    """One leaderboard task's score: the mean of its metrics (and for MNLI of m and mm)."""
    if task not in LEADERBOARD_TASKS:
        raise LmlabError(f"{task!r} is not a GLUE leaderboard task",
                         f"use one of {', '.join(LEADERBOARD_TASKS)}")
    values = [
        _metric(results, part, metric)
        for part in LEADERBOARD_TASKS[task]
        for metric in GLUE_TASKS[part].metrics
    ]
    return sum(values) / len(values)


def glue_score(results: Mapping[str, Mapping[str, float]], partial: bool = False) -> float:
    """The official GLUE benchmark score: the mean of the nine task scores.

    Args:
        results: ``{task: {metric: value}}`` for every task in :data:`GLUE_TASKS`.
        partial: average only the tasks present (a convenient dev-set summary that is *not*
            comparable with the leaderboard) instead of raising for missing tasks.
    """
    tasks = [t for t in LEADERBOARD_TASKS
             if not partial or all(p in results for p in LEADERBOARD_TASKS[t])]
    if not tasks:
        raise LmlabError("no GLUE task results to average", "evaluate at least one GLUE task")
    return sum(glue_task_score(results, t) for t in tasks) / len(tasks)


def bert_glue_average(results: Mapping[str, Mapping[str, float]], partial: bool = False) -> float:
    """The BERT paper's GLUE "Average": 9 entries, WNLI excluded, MNLI-m and -mm separate."""
    entries = [(k, row.bert_metric) for k, row in GLUE_TASKS.items() if row.bert_metric]
    if partial:
        entries = [(k, m) for k, m in entries if k in results]
    if not entries:
        raise LmlabError("no GLUE task results to average", "evaluate at least one GLUE task")
    return sum(_metric(results, k, m) for k, m in entries) / len(entries)
