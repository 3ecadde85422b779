"""The settings of the compression jobs (:mod:`lmlab.compress.jobs`), typed and checked when
they are made. No torch here: a command refuses bad settings before torch loads, and the
pruning and low-rank functions check their arguments with the same settings.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.utils.checks import check_at_least
from lmlab.utils.errors import LmlabError

#: the advice of the pruning settings' range errors (also raised by lmlab.compress.magnitude)
SPARSITY_FIX = "give the fraction of weights to remove, e.g. 0.5 for half"
PRUNE_FRACTION_FIX = "give the fraction of surviving weights each round removes, e.g. 0.2"
REWIND_FIX = "use 0 (the initial weights) or an early optimizer step"


def check_fraction(value: float, option: str, allow_zero: bool = False,
                   fix: str | None = None) -> None:
    """``value`` in (0, 1), or [0, 1) with ``allow_zero``."""
    if not ((0 <= value if allow_zero else 0 < value) and value < 1):
        raise LmlabError(f"{option} {value} is outside {'[0' if allow_zero else '(0'}, 1)",
                         fix or f"give {option} as a fraction, e.g. 0.2")


def parse_fractions(text: str, option: str) -> tuple[float, ...]:
    """Comma-separated fractions in [0, 1) (``"0.3,0.6,0.9"``)."""
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError as error:
        raise LmlabError(f"{option} {text!r} is not a list of numbers",
                         f"e.g. {option} 0.3,0.6,0.9") from error
    if not values:
        raise LmlabError(f"{option} is empty", f"e.g. {option} 0.5")
    for value in values:
        check_fraction(value, option, allow_zero=True)
    return values


@dataclass(frozen=True)
class HeadPruning:
    """Michel et al.'s iterative head pruning: ``step`` of the heads removed per step until
    ``max_fraction``, scored on ``importance_examples`` of ``importance_split``."""

    step: float = 0.1
    max_fraction: float = 0.5
    importance_split: str = "dev"
    importance_examples: int = 256
    recompute: bool = True
    finetune_steps: int = 0  # first fine-tune a model without the task's head

    def __post_init__(self) -> None:
        check_fraction(self.step, "--step")
        check_fraction(self.max_fraction, "--max")
        check_at_least(self.importance_examples, 1, "--importance-examples")
        check_at_least(self.finetune_steps, 0, "--finetune-steps")


@dataclass(frozen=True)
class MagnitudePruning:
    """Unstructured magnitude pruning to each of ``sparsities``: while fine-tuning for ``steps``
    (the sparsity rising from 10% to 70% of the run on a ``schedule``, masks updated
    ``every`` steps), or in one shot (``steps`` 0); ``scope`` global or per matrix."""

    sparsities: tuple[float, ...] = (0.5,)
    steps: int = 0
    every: int = 10
    scope: str = "global"
    schedule: str = "cubic"

    def __post_init__(self) -> None:
        for value in self.sparsities:
            check_fraction(value, "--sparsity", allow_zero=True, fix=SPARSITY_FIX)
        check_at_least(self.steps, 0, "--steps")
        check_at_least(self.every, 1, "--every")


@dataclass(frozen=True)
class Lottery:
    """The lottery ticket procedure: ``rounds`` of training for ``steps``, pruning
    ``prune_fraction`` of the surviving weights and rewinding the survivors to
    ``rewind_step``."""

    rounds: int = 3
    prune_fraction: float = 0.2
    rewind_step: int = 0
    scope: str = "global"
    steps: int = 200

    def __post_init__(self) -> None:
        check_at_least(self.rounds, 1, "--rounds")
        check_at_least(self.steps, 1, "--steps")
        check_at_least(self.rewind_step, 0, "--rewind-step", REWIND_FIX)
        check_fraction(self.prune_fraction, "--prune-fraction", fix=PRUNE_FRACTION_FIX)
        if self.rewind_step >= self.steps:
            raise LmlabError(f"--rewind-step {self.rewind_step} is not before the end of "
                             f"training (--steps {self.steps})",
                             "rewind to an early step, e.g. 5% of --steps")


@dataclass(frozen=True)
class LowRank:
    """Truncated SVD of the layers' linear maps: one ``rank`` for every matrix, or per matrix
    the smallest rank keeping ``energy`` of sum s_i^2; ``modules`` (names) limit which."""

    rank: int | None = None
    energy: float | None = None
    modules: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if (self.rank is None) == (self.energy is None):
            raise LmlabError("give exactly one of --rank and --energy",
                             "e.g. --rank 64 or --energy 0.9")
        check_at_least(self.rank, 1, "--rank")
        if self.energy is not None and not 0 < self.energy <= 1:
            raise LmlabError(f"--energy {self.energy} is outside (0, 1]",
                             "give the fraction of squared singular values to keep, e.g. 0.9")
