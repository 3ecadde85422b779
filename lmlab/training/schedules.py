"""Learning-rate schedules as pure functions of the step and the run's horizon.

Every schedule returns a multiplier of the peak learning rate for the optimizer step ``step``
(0 = the first update), following Hugging Face's conventions so runs compare with theirs (the
first warmup step has multiplier 0):

- ``linear``: warmup ``s/w``, then ``(T - s) / (T - w)`` down to ``min_lr_ratio`` (BERT).
- ``cosine``: warmup, then ``0.5 (1 + cos(pi q))`` with ``q = (s - w) / (T - w)``.
- ``constant``: warmup, then 1.
- ``inverse_sqrt``: warmup, then ``sqrt(w / s)`` (the Transformer's "Noam" schedule, normalised
  to peak 1 at ``s = w``); needs no horizon.
- ``triangular``: ULMFiT's slanted triangular LR: rises for ``cut = cut_frac T`` steps from
  ``1/ratio`` to 1, then falls linearly back to ``1/ratio`` at ``T``.

The horizon ``T`` (total optimizer steps) is exact for step-limited runs. For token- or
time-limited runs it is estimated, as cramming does, from the fraction of the limit used so far:
``T = s / fraction`` (see :func:`estimate_horizon`); under a time budget that estimate follows the
measured step time, so the schedule ends when the budget does.
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
        """Whether the run's horizon changes any factor: it does for the decaying schedules and
        a warmup given as a fraction of the run, not for constant or inverse-sqrt ones warmed
        up over a step count (a resumed run may then change its limits)."""
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
    """Total optimizer steps the run will make: the smallest over the limits that are set.

    A step limit is exact. Token and time limits are extrapolated from the rate so far
    (``step x limit / used``), which is what scheduling "by elapsed fraction of the budget" means
    in cramming. Before the first step only the step limit is known (else ``inf``).
    """
    estimates = [float(max_steps)] if max_steps is not None else []
    if step > 0:
        if max_tokens is not None and tokens > 0:
            estimates.append(step * max_tokens / tokens)
        if budget_seconds is not None and elapsed > 0:
            estimates.append(step * budget_seconds / elapsed)
    return max(1.0, min(estimates)) if estimates else math.inf
