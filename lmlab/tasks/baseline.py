"""The classical baseline beside every task: TF-IDF word 1-2-grams + logistic or ridge regression
(scikit-learn), its setting picked on dev (docs/tasks.md); for an image task, logistic regression
on the pixels (scaled to [0, 1]). A fine-tuned Transformer should beat
it; if it does not, suspect the fine-tuning.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lmlab.tasks.readers import check_pair_texts
from lmlab.tasks.types import Example, Task
from lmlab.utils.errors import LmlabError

C_GRID = (0.1, 1.0, 10.0, 100.0)
ALPHA_GRID = (0.1, 1.0, 10.0, 100.0)
SUPPORTED_TYPES = ("classification", "pair-classification", "regression", "image-classification")


def _pixels(examples: list[Example]):
    """(N, pixels) floats in [0, 1] of the examples' images (one size per task)."""
    import numpy as np

    shapes = {np.shape(e.image) for e in examples}
    if len(shapes) != 1:
        raise LmlabError(f"the pixel baseline needs images of one size, got {sorted(shapes)}",
                         "resize the task's images to one size")
    return np.stack([np.asarray(e.image, dtype=np.float32).reshape(-1) for e in examples]) / 255


def _features(task: Task, train: list[Example], others: list[list[Example]]):
    if task.type == "image-classification":
        return _pixels(train), [_pixels(examples) for examples in others]
    from scipy import sparse
    from sklearn.feature_extraction.text import TfidfVectorizer

    # n-grams of one training text cannot generalise; min_df=2 makes the solver 5-10x faster
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, lowercase=True,
                                 min_df=2 if len(train) >= 500 else 1, max_features=300_000)
    pair = task.is_pair
    fit_texts = [e.text or "" for e in train]
    if pair:
        fit_texts += [e.text_pair or "" for e in train]
    vectorizer.fit(fit_texts)

    def transform(examples: list[Example]):
        first = vectorizer.transform([e.text or "" for e in examples])
        if not pair:
            return first
        second = vectorizer.transform([e.text_pair or "" for e in examples])
        return sparse.hstack([first, second, first.multiply(second)]).tocsr()

    return transform(train), [transform(examples) for examples in others]


def _check(task: Task, train: list[Example]) -> None:
    if task.type not in SUPPORTED_TYPES:
        raise LmlabError(f"the TF-IDF baseline does not handle {task.type} tasks ({task.name})",
                         f"use it on {', '.join(SUPPORTED_TYPES)} tasks")
    if task.type == "pair-classification":
        for split, examples in task.splits.items():
            check_pair_texts(examples, f"task {task.name!r}, {split}")
    if task.type != "regression" and len({e.label for e in train}) < 2:
        raise LmlabError(f"the training split of {task.name!r} has fewer than two labels",
                         "give training examples of at least two classes")


def run_tfidf_baseline(task: Task, seed: int = 0, grid: tuple[float, ...] | None = None,
                       return_predictions: bool = False) -> dict[str, Any]:
    """Train TF-IDF (an image task: pixels) + logistic/ridge regression on ``train``, pick the C (alpha) of ``grid``
    best on ``dev``, score ``test`` (if labelled): ``{"task", "model", "param", "selected_by",
    "chosen", "grid": {value: dev score}, "dev", "test", "sizes"}`` (+ ``predictions``)."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression, Ridge

    train = task.split("train")
    dev = task.split("dev")
    _check(task, train)
    test = task.splits.get("test") or []
    regression = task.type == "regression"
    x_train, (x_dev, x_test) = _features(task, train, [dev, test] if test else [dev, dev[:1]])
    y_train = np.asarray([e.label for e in train], dtype=np.float64 if regression else object)
    metric = task.metrics[0]
    param = "alpha" if regression else "C"
    values = tuple(grid or (ALPHA_GRID if regression else C_GRID))

    def make(value: float):
        if regression:
            return Ridge(alpha=value, random_state=seed)
        if task.type == "image-classification":  # dense pixels: lbfgs beats saga here
            return LogisticRegression(C=value, max_iter=300, random_state=seed)
        # saga converges in seconds here where lbfgs takes minutes on 40-class TF-IDF problems
        return LogisticRegression(C=value, solver="saga", tol=1e-3, max_iter=1000,
                                  random_state=seed)

    def predict(model, x) -> list[Any]:
        out = model.predict(x)
        return [float(v) for v in out] if regression else [str(v) for v in out]

    scores: dict[str, float] = {}
    best_value, best_score, best_model = None, -np.inf, None
    for value in values:
        model = make(value).fit(x_train, y_train)
        score = task.evaluate("dev", predict(model, x_dev))[metric]
        scores[repr(value)] = score
        if score > best_score:
            best_value, best_score, best_model = value, score, model
    predictions = {"dev": predict(best_model, x_dev)}
    result: dict[str, Any] = {
        "task": task.name, "model": ("pixels" if task.type == "image-classification" else
                                     "tfidf") + ("+ridge" if regression else "+logreg"),
        "param": param, "chosen": best_value, "selected_by": f"dev {metric}",
        "grid": scores, "seed": seed,
        "dev": task.evaluate("dev", predictions["dev"]),
        "sizes": {"train": len(train), "dev": len(dev), "test": len(test)},
    }
    if test:
        predictions["test"] = predict(best_model, x_test)
        if all(e.label is not None for e in test):
            result["test"] = task.evaluate("test", predictions["test"])
    if return_predictions:
        result["predictions"] = predictions
    return result


def write_tfidf_baseline(task: Task, out: str | Path, seed: int = 0) -> dict[str, Any]:
    """What ``lmlab baseline`` does: :func:`run_tfidf_baseline`, its metrics written to
    ``out/metrics.json`` and each split's predictions (id, prediction, label) to
    ``out/predictions-<split>.jsonl``. Returns the metrics."""
    from lmlab.utils.io import atomic_write_json, atomic_write_text

    result = run_tfidf_baseline(task, seed=seed, return_predictions=True)
    predictions = result.pop("predictions")
    out = Path(out)
    atomic_write_json(out / "metrics.json", result)
    for split, values in predictions.items():
        lines = [json.dumps({"id": e.id, "prediction": p, "label": e.label}, ensure_ascii=False)
                 for e, p in zip(task.splits[split], values)]
        atomic_write_text(out / f"predictions-{split}.jsonl", "\n".join(lines) + "\n")
    return result
