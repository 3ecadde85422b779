"""Learning-rate schedules as pure functions of the step and the run's horizon: multipliers of
the peak LR, following Hugging Face's conventions (the first warmup step has multiplier 0).
docs/training.md ("What a step does", "When a run ends") describes each one and the horizon.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Schedule:
    """A named schedule with its warmup and shape parameters."""

    name: str = "linear"
    warmup_steps: int | None = None
    warmup_fraction: float = 0.0
    min_lr_ratio: float = 0.0
    cut_frac: float = 0.1
    ratio: float = 32.0

    @property
    def uses_horizon(self) -> bool:
        """Whether the run's horizon changes any factor (not for constant or inverse-sqrt
        schedules warmed up over a step count)."""
        return (self.name not in ("constant", "inverse_sqrt")
                or (self.warmup_steps is None and self.warmup_fraction > 0))

    def warmup(self, horizon: float) -> float:
        """Warmup length in steps (explicit, or a fraction of the horizon)."""
        if self.warmup_steps is not None:
            return float(self.warmup_steps)
        if math.isinf(horizon):
            return 0.0
        return self.warmup_fraction * horizon

    def factor(self, step: int, horizon: float) -> float:
        """Multiplier of the peak LR at optimizer step ``step`` of a run of ``horizon`` steps
        (``math.inf`` when unknown: decays are then held at their start)."""
        s, total = float(step), float(horizon)
        if self.name == "triangular":
            return triangular(s, total, self.cut_frac, self.ratio)
        w = self.warmup(total)
        if s < w:
            return s / w
        if self.name == "constant":
            return 1.0
        if self.name == "inverse_sqrt":
            return math.sqrt(w / s) if w > 0 and s > 0 else 1.0
        if math.isinf(total):
            return 1.0
        q = min(1.0, max(0.0, (s - w) / max(1.0, total - w)))
        floor = self.min_lr_ratio
        if self.name == "linear":
            return floor + (1.0 - floor) * (1.0 - q)
        if self.name == "cosine":
            return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * q))
        raise ValueError(f"unknown schedule {self.name!r}")


def triangular(step: float, horizon: float, cut_frac: float = 0.1, ratio: float = 32.0) -> float:
    """ULMFiT's slanted triangular multiplier (Howard & Ruder 2018, eq. 3), peak 1."""
    if math.isinf(horizon):
        return 1.0
    cut = math.floor(horizon * cut_frac)
    if cut <= 0:
        p = 1.0 - step / max(1.0, horizon)
    elif step < cut:
        p = step / cut
    else:
        p = 1.0 - (step - cut) / (cut * (1.0 / cut_frac - 1.0))
    p = max(0.0, p)
    return (1.0 + p * (ratio - 1.0)) / ratio


def estimate_horizon(step: int, tokens: int, elapsed: float, max_steps: int | None,
                     max_tokens: int | None, budget_seconds: float | None) -> float:
    """Total optimizer steps the run will make: the smallest over the limits that are set (a
    token or time limit extrapolated from the rate so far; ``inf`` when unknown)."""
    estimates = [float(max_steps)] if max_steps is not None else []
    if step > 0:
        if max_tokens is not None and tokens > 0:
            estimates.append(step * max_tokens / tokens)
        if budget_seconds is not None and elapsed > 0:
            estimates.append(step * budget_seconds / elapsed)
    return max(1.0, min(estimates)) if estimates else math.inf
