"""Writing a run's results: metrics, predictions, the confusion matrix, seed summaries."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lmlab.utils.io import atomic_path, atomic_write_text


def summarize_seeds(runs: Sequence[dict[str, Any]], split: str = "dev") -> dict[str, Any]:
    """Median and spread (max - min) of every metric of ``split`` over seeds.

    Fine-tuning results vary with the seed (Dodge et al. 2020); one number hides that, so
    reports give the median and the spread of several seeds."""
    metrics: dict[str, list[float]] = {}
    for run in runs:
        for name, value in (run.get(split) or {}).items():
            metrics.setdefault(name, []).append(float(value))
    return {name: {"median": statistics.median(values), "spread": max(values) - min(values),
                   "min": min(values), "max": max(values), "values": values, "n": len(values)}
            for name, values in metrics.items()}


def write_predictions(path: str | Path, ids: Sequence[str], predictions: Sequence[Any],
                      references: Sequence[Any] | None = None) -> None:
    """JSON lines ``{"id", "prediction"[, "reference"]}``, written atomically."""
    import json

    lines = []
    for i, (example_id, prediction) in enumerate(zip(ids, predictions)):
        row: dict[str, Any] = {"id": example_id, "prediction": prediction}
        if references is not None:
            row["reference"] = references[i]
        lines.append(json.dumps(row, ensure_ascii=False))
    atomic_write_text(path, "\n".join(lines) + "\n")


def confusion_matrix(predictions: Sequence[str], references: Sequence[str],
                     labels: Sequence[str]) -> list[list[int]]:
    """``matrix[i][j]`` = examples of gold label i predicted as j."""
    index = {label: i for i, label in enumerate(labels)}
    matrix = [[0] * len(labels) for _ in labels]
    for p, r in zip(predictions, references):
        if p in index and r in index:
            matrix[index[r]][index[p]] += 1
    return matrix


def plot_confusion(path: str | Path, matrix: list[list[int]], labels: Sequence[str],
                   title: str) -> Path:
    """Row-normalised confusion matrix as a PNG (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    counts = np.asarray(matrix, dtype=float)
    rows = counts / np.maximum(counts.sum(1, keepdims=True), 1)
    size = max(4.0, 0.22 * len(labels) + 2)
    fig, ax = plt.subplots(figsize=(size, size))
    ax.imshow(rows, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=6)
    ax.set_yticks(range(len(labels)), labels, fontsize=6)
    ax.set_xlabel("predicted")
    ax.set_ylabel("gold")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return path
