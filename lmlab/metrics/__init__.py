"""Evaluation metrics: classification, regression, tagging, question answering, perplexity, GLUE,
generated text. All return fractions; tasks name theirs (``Task.metrics``) and
:func:`compute_metrics` turns the names into numbers (docs/metrics.md).

Example:
    >>> from lmlab.metrics import compute_metrics
    >>> compute_metrics(["accuracy", "f1"], predictions=[1, 0, 1], references=[1, 1, 1])
    {'accuracy': 0.666..., 'f1': 0.8}
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from lmlab.metrics.classification import (
    accuracy,
    f1_score,
    matthews_corrcoef,
    pearson,
    precision_recall_f1,
    spearman,
)
from lmlab.metrics.generation import bleu, chrf, sequence_accuracy
from lmlab.metrics.glue import GLUE_TASKS, bert_glue_average, glue_score, glue_task_score
from lmlab.metrics.perplexity import bits_per_token, perplexity, perplexity_from_sums
from lmlab.metrics.squad import normalize_answer, squad_evaluate, squad_scores
from lmlab.metrics.tagging import entity_scores, get_entities
from lmlab.utils.checks import check_choice
from lmlab.utils.errors import LmlabError

# metric name -> what it expects; used in error messages and docs
METRICS: dict[str, str] = {
    "accuracy": "labels",
    "f1": "labels (binary F1 of the positive label)",
    "macro_f1": "labels",
    "micro_f1": "labels",
    "mcc": "labels (Matthews correlation)",
    "pearson": "real numbers",
    "spearman": "real numbers",
    "entity_f1": "tag sequences (conlleval chunks)",
    "entity_precision": "tag sequences (conlleval chunks)",
    "entity_recall": "tag sequences (conlleval chunks)",
    "strict_entity_f1": "tag sequences (IOB2 strict chunks)",
    "exact_match": "answer strings vs lists of gold answers (SQuAD)",
    "squad_f1": "answer strings vs lists of gold answers (SQuAD)",
    "bleu": "generated strings vs reference strings (corpus BLEU, sacrebleu)",
    "chrf": "generated strings vs reference strings (corpus chrF, sacrebleu)",
    "sequence_accuracy": "generated strings vs reference strings (exact, whitespace collapsed)",
}


# metrics of (predictions, references) alone
_PLAIN_METRICS = {
    "accuracy": accuracy, "macro_f1": partial(f1_score, average="macro"),
    "micro_f1": partial(f1_score, average="micro"), "mcc": matthews_corrcoef,
    "pearson": pearson, "spearman": spearman, "bleu": bleu, "chrf": chrf,
    "sequence_accuracy": sequence_accuracy,
}


def compute_metric(name: str, predictions: Sequence[Any], references: Sequence[Any],
                   positive_label: Any = 1) -> float:
    """One named metric (see :data:`METRICS`) of ``predictions`` against ``references``."""
    check_choice(name, METRICS, "metric", "metric")
    if name in _PLAIN_METRICS:
        return _PLAIN_METRICS[name](predictions, references)
    if name == "f1":
        return f1_score(predictions, references, average="binary", pos_label=positive_label)
    if name in ("entity_f1", "entity_precision", "entity_recall", "strict_entity_f1"):
        mode = "strict" if name.startswith("strict") else "conlleval"
        key = name.rsplit("_", 1)[1]
        return float(entity_scores(predictions, references, mode=mode)[key])
    ids = [str(i) for i in range(len(references))]  # exact_match, squad_f1
    if len(predictions) != len(references):
        raise LmlabError(f"{len(predictions)} answers for {len(references)} questions",
                         "pass one predicted answer per question")
    scores = squad_evaluate(dict(zip(ids, predictions)), dict(zip(ids, references)))
    return scores["exact_match" if name == "exact_match" else "f1"]


def compute_metrics(names: Sequence[str], predictions: Sequence[Any], references: Sequence[Any],
                    positive_label: Any = 1) -> dict[str, float]:
    """Several named metrics at once: ``{name: value}``."""
    return {name: compute_metric(name, predictions, references, positive_label) for name in names}


__all__ = [
    "GLUE_TASKS", "METRICS", "accuracy", "bert_glue_average", "bits_per_token", "bleu", "chrf",
    "compute_metric",
    "compute_metrics", "entity_scores", "f1_score", "get_entities", "glue_score",
    "glue_task_score", "matthews_corrcoef", "normalize_answer", "pearson", "perplexity",
    "perplexity_from_sums", "precision_recall_f1", "sequence_accuracy", "spearman",
    "squad_evaluate", "squad_scores",
]
