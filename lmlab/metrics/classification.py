"""Classification and regression metrics: accuracy, F1, Matthews correlation, Pearson, Spearman.

Written with numpy only (no scikit-learn at run time) and checked against scikit-learn and scipy
in ``tests/test_metrics.py``. Every function returns a plain ``float`` in the natural range of
the metric (accuracy and F1 in [0, 1], correlations in [-1, 1]); reports multiply by 100.

Conventions where a metric is undefined (no positive predictions, constant predictions) follow
scikit-learn's ``zero_division=0``: the undefined quantity counts as 0.0 instead of NaN, so a
model that predicts one class early in training still gets a number that can be averaged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lmlab.utils.errors import LmlabError

_AVERAGES = ("binary", "macro", "micro")


def _as_pair(predictions: Sequence[Any], references: Sequence[Any]):
    import numpy as np

    pred = np.asarray(list(predictions))
    ref = np.asarray(list(references))
    if pred.shape[0] != ref.shape[0]:
        raise LmlabError(f"{pred.shape[0]} predictions for {ref.shape[0]} references",
                         "pass exactly one prediction per reference example")
    if ref.shape[0] == 0:
        raise LmlabError("no examples to score (the evaluation set is empty)",
                         "evaluate on a split that has at least one example")
    return pred, ref


def accuracy(predictions: Sequence[Any], references: Sequence[Any]) -> float:
    """Fraction of predictions equal to their reference label."""
    pred, ref = _as_pair(predictions, references)
    return float((pred == ref).mean())


def _counts(pred, ref, label) -> tuple[int, int, int]:
    """Correct predictions, predictions and references of one label (tp, tp + fp, tp + fn)."""
    tp = int(((pred == label) & (ref == label)).sum())
    return tp, int((pred == label).sum()), int((ref == label).sum())


def prf_from_counts(correct: int, n_pred: int, n_gold: int) -> tuple[float, float, float]:
    """Precision, recall and F1 from counts; an undefined ratio (0 / 0) counts as 0.0.

    Shared by the label metrics here and the entity metrics of :mod:`lmlab.metrics.tagging`.
    """
    precision = correct / n_pred if n_pred else 0.0
    recall = correct / n_gold if n_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def precision_recall_f1(predictions: Sequence[Any], references: Sequence[Any],
                        average: str = "binary", pos_label: Any = 1,
                        labels: Sequence[Any] | None = None) -> tuple[float, float, float]:
    """Precision, recall and F1 like scikit-learn's ``precision_recall_fscore_support``.

    Args:
        average: ``"binary"`` scores only ``pos_label``; ``"macro"`` averages the per-label
            scores with equal weight over ``labels`` (default: every label seen in predictions
            or references); ``"micro"`` pools the counts of all labels (equal to accuracy for
            single-label classification over all labels).
        pos_label: the positive class for ``average="binary"`` (1 for GLUE's MRPC and QQP).
        labels: the labels to include for macro/micro averaging.
    """
    import numpy as np

    if average not in _AVERAGES:
        raise LmlabError(f"unknown F1 average {average!r}", f"use one of {', '.join(_AVERAGES)}")
    pred, ref = _as_pair(predictions, references)
    if average == "binary":
        return prf_from_counts(*_counts(pred, ref, pos_label))
    if labels is None:
        labels = np.unique(np.concatenate([pred, ref]))
    if average == "micro":
        correct = n_pred = n_gold = 0
        for label in labels:
            a, b, c = _counts(pred, ref, label)
            correct, n_pred, n_gold = correct + a, n_pred + b, n_gold + c
        return prf_from_counts(correct, n_pred, n_gold)
    scores = np.array([prf_from_counts(*_counts(pred, ref, label)) for label in labels],
                      dtype=np.float64)
    precision, recall, f1 = scores.mean(axis=0)
    return float(precision), float(recall), float(f1)


def f1_score(predictions: Sequence[Any], references: Sequence[Any], average: str = "binary",
             pos_label: Any = 1, labels: Sequence[Any] | None = None) -> float:
    """F1 score (``average`` = binary, macro or micro; see :func:`precision_recall_f1`)."""
    return precision_recall_f1(predictions, references, average, pos_label, labels)[2]


def matthews_corrcoef(predictions: Sequence[Any], references: Sequence[Any]) -> float:
    """Matthews correlation coefficient (CoLA's metric), multiclass form of Gorodkin (2004).

    With the confusion matrix C (rows: reference, columns: prediction), s = number of samples,
    c = trace(C), t_k = row sums, p_k = column sums:
    ``MCC = (c*s - sum_k p_k t_k) / sqrt((s^2 - sum_k p_k^2) (s^2 - sum_k t_k^2))``;
    0.0 when the denominator is 0 (e.g. all predictions identical), as in scikit-learn.
    """
    import numpy as np

    pred, ref = _as_pair(predictions, references)
    labels, inverse = np.unique(np.concatenate([ref, pred]), return_inverse=True)
    n = ref.shape[0]
    ref_idx, pred_idx = inverse[:n], inverse[n:]
    k = labels.shape[0]
    confusion = np.zeros((k, k), dtype=np.float64)
    np.add.at(confusion, (ref_idx, pred_idx), 1.0)
    t_sum = confusion.sum(axis=1)
    p_sum = confusion.sum(axis=0)
    correct = np.trace(confusion)
    s = confusion.sum()
    cov_ytyp = correct * s - np.dot(t_sum, p_sum)
    cov_ypyp = s * s - np.dot(p_sum, p_sum)
    cov_ytyt = s * s - np.dot(t_sum, t_sum)
    denominator = np.sqrt(cov_ytyt * cov_ypyp)
    if denominator == 0:
        return 0.0
    return float(cov_ytyp / denominator)


def _float_pair(predictions: Sequence[float], references: Sequence[float]):
    import numpy as np

    pred, ref = _as_pair(predictions, references)
    return pred.astype(np.float64), ref.astype(np.float64)


def _pearson(x, y) -> float:
    import numpy as np

    x = x - x.mean()
    y = y - y.mean()
    denominator = np.sqrt(np.dot(x, x) * np.dot(y, y))
    if denominator == 0:
        return 0.0
    return float(np.clip(np.dot(x, y) / denominator, -1.0, 1.0))


def pearson(predictions: Sequence[float], references: Sequence[float]) -> float:
    """Pearson correlation (STS-B); 0.0 when either side is constant (undefined)."""
    return _pearson(*_float_pair(predictions, references))


def rankdata(values) -> Any:
    """Ranks 1..n with ties given their average rank (scipy's ``rankdata(method='average')``)."""
    import numpy as np

    values = np.asarray(values)
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    # boundaries of runs of equal values in sorted order
    new_run = np.concatenate([[True], sorted_values[1:] != sorted_values[:-1]])
    run_id = np.cumsum(new_run) - 1
    run_starts = np.flatnonzero(new_run)
    run_ends = np.concatenate([run_starts[1:], [values.shape[0]]])
    average_rank = (run_starts + run_ends + 1) / 2.0  # mean of ranks start+1 .. end
    ranks = np.empty(values.shape[0], dtype=np.float64)
    ranks[order] = average_rank[run_id]
    return ranks


def spearman(predictions: Sequence[float], references: Sequence[float]) -> float:
    """Spearman rank correlation: Pearson correlation of average-tie ranks (STS-B)."""
    pred, ref = _float_pair(predictions, references)
    return _pearson(rankdata(pred), rankdata(ref))
