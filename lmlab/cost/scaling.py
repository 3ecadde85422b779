"""Scaling laws in the manner of Kaplan et al. (2020): a power law ``L = a * x^-b`` fitted by
least squares in log space (with its R^2 there), and the compute frontier, the lowest loss any
run reached for at most a given compute (the envelope of the per-size curves, their Figure 1).
Usage: scripts/scaling_fit.py, docs/scaling.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from lmlab.utils.errors import LmlabError


@dataclass(frozen=True)
class PowerLaw:
    """``L(x) = a * x^-b``; ``r2`` is the share of the variance of log L the line explains."""

    a: float
    b: float
    r2: float
    points: int

    def __call__(self, x: float | np.ndarray) -> float | np.ndarray:
        return self.a * np.power(x, -self.b)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def _positive(values: Sequence[float], name: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or not np.all(np.isfinite(array)) or not np.all(array > 0):
        raise LmlabError(f"a power law needs finite {name} > 0 (got {list(values)[:6]}...)",
                         f"pass one positive {name} value per point")
    return array


def fit_power_law(x: Sequence[float], y: Sequence[float]) -> PowerLaw:
    """Least squares of ``log y = log a - b log x`` over the points; R^2 in log space."""
    lx, ly = np.log(_positive(x, "x")), np.log(_positive(y, "y"))
    if len(lx) != len(ly) or len(lx) < 3 or np.ptp(lx) == 0:
        raise LmlabError(f"{len(lx)} x and {len(ly)} y values, {len(set(lx.tolist()))} distinct x",
                         "fit at least 3 points (with at least 2 distinct x), one y per x")
    slope, intercept = np.polyfit(lx, ly, 1)
    residual = float(np.sum((ly - (intercept + slope * lx)) ** 2))
    total = float(np.sum((ly - ly.mean()) ** 2))
    r2 = 1.0 - residual / total if total > 0 else math.nan
    return PowerLaw(a=float(math.exp(intercept)), b=float(-slope), r2=r2, points=len(lx))


def compute_frontier(compute: Sequence[float], loss: Sequence[float]) -> list[int]:
    """Indices of the frontier points, by rising compute: each has a lower loss than every
    point of at most its compute (the Pareto set of (compute, loss), lower is better)."""
    c, losses = _positive(compute, "compute"), np.asarray(loss, dtype=np.float64)
    if len(c) != len(losses) or not np.all(np.isfinite(losses)):
        raise LmlabError(f"{len(c)} compute and {len(losses)} loss values (or a loss not "
                         "finite)", "pass one finite loss per compute value")
    best, keep = math.inf, []
    for i in np.lexsort((losses, c)).tolist():  # by compute, then loss
        if losses[i] < best:
            best = float(losses[i])
            keep.append(i)
    return keep
