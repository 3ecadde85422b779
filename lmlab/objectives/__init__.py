"""Pretraining objectives: a batch transform (corruption) + the heads it needs + a loss, built
by name with :func:`build_objective` (``"mlm,sop"`` composes). Importing this package stays
light: the objective classes (and torch) load on first use. See docs/objectives.md."""

from lmlab.objectives.registry import (
    available_objectives,
    build_objective,
    get_factory,
    register_objective,
)
from lmlab.objectives.special_tokens import SpecialTokens

__all__ = ["SpecialTokens", "available_objectives", "build_objective", "get_factory",
           "register_objective"]
