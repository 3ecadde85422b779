"""The GLUE benchmark's metrics per task and its two one-number summaries: the leaderboard's
:func:`glue_score` and the BERT paper's :func:`bert_glue_average` (docs/metrics.md says how they
differ and which published numbers check them). Results are ``{task: {metric: value}}`` with the
keys of :data:`GLUE_TASKS`, on one scale for every task.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from lmlab.utils.checks import check_choice
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
    check_choice(task, LEADERBOARD_TASKS, "task", "GLUE leaderboard task")
    values = [
        _metric(results, part, metric)
        for part in LEADERBOARD_TASKS[task]
        for metric in GLUE_TASKS[part].metrics
    ]
    return sum(values) / len(values)


def glue_score(results: Mapping[str, Mapping[str, float]], partial: bool = False) -> float:
    """The official GLUE benchmark score: the mean of the nine task scores (``partial``: of
    the tasks present, a dev-set summary not comparable with the leaderboard)."""
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
