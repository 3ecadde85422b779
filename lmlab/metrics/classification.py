"""Classification and regression metrics: accuracy, F1, Matthews correlation, Pearson, Spearman.

Computed by scikit-learn and scipy; this module checks the inputs (one prediction per reference,
at least one example) and keeps lmlab's conventions: plain floats, and 0.0 where a metric is
undefined (scikit-learn's ``zero_division=0``; a constant side of a correlation), so a model that
predicts one class early in training still gets a number that can be averaged.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

from lmlab.utils.checks import check_choice
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


def prf_from_counts(correct: int, n_pred: int, n_gold: int) -> tuple[float, float, float]:
    """Precision, recall and F1 from counts (the entity metrics'); 0 / 0 counts as 0.0."""
    precision = correct / n_pred if n_pred else 0.0
    recall = correct / n_gold if n_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def precision_recall_f1(predictions: Sequence[Any], references: Sequence[Any],
                        average: str = "binary", pos_label: Any = 1,
                        labels: Sequence[Any] | None = None) -> tuple[float, float, float]:
    """Precision, recall and F1 (scikit-learn's ``precision_recall_fscore_support``).

    Args:
        average: ``"binary"`` scores only ``pos_label`` (also when other labels occur, e.g. a
            generated text that is no label); ``"macro"`` averages the per-label scores over
            ``labels`` (default: every label seen); ``"micro"`` pools the counts of all labels.
        pos_label: the positive class for ``average="binary"`` (1 for GLUE's MRPC and QQP).
        labels: the labels to include for macro/micro averaging.
    """
    from sklearn.metrics import precision_recall_fscore_support

    check_choice(average, _AVERAGES, "average", "F1 average")
    pred, ref = _as_pair(predictions, references)
    if average == "binary":  # per-label scores of the one label: defined for any label set
        labels, average = [pos_label], None
    scores = precision_recall_fscore_support(ref, pred, labels=labels, average=average,
                                             zero_division=0)[:3]
    return tuple(float(value if average else value[0]) for value in scores)


def f1_score(predictions: Sequence[Any], references: Sequence[Any], average: str = "binary",
             pos_label: Any = 1, labels: Sequence[Any] | None = None) -> float:
    """F1 score (``average`` = binary, macro or micro; see :func:`precision_recall_f1`)."""
    return precision_recall_f1(predictions, references, average, pos_label, labels)[2]


def matthews_corrcoef(predictions: Sequence[Any], references: Sequence[Any]) -> float:
    """Matthews correlation coefficient (CoLA's metric, multiclass form); 0.0 when undefined."""
    from sklearn.metrics import matthews_corrcoef as sklearn_mcc

    pred, ref = _as_pair(predictions, references)
    return float(sklearn_mcc(ref, pred))


def _correlation(function, predictions: Sequence[float], references: Sequence[float]) -> float:
    """``function(pred, ref)``'s statistic as a float; 0.0 when a side is constant (undefined)."""
    import numpy as np

    pred, ref = _as_pair(predictions, references)
    pred, ref = pred.astype(np.float64), ref.astype(np.float64)
    if np.ptp(pred) == 0 or np.ptp(ref) == 0:
        return 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns on near-constant input; NaN is handled
        value = float(function(pred, ref)[0])
    return 0.0 if math.isnan(value) else value


def pearson(predictions: Sequence[float], references: Sequence[float]) -> float:
    """Pearson correlation (STS-B); 0.0 when either side is constant."""
    from scipy.stats import pearsonr

    return _correlation(pearsonr, predictions, references)


def spearman(predictions: Sequence[float], references: Sequence[float]) -> float:
    """Spearman rank correlation, ties at their average rank (STS-B); 0.0 when a side is
    constant."""
    from scipy.stats import spearmanr

    return _correlation(spearmanr, predictions, references)
