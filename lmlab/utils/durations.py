"""Parse human durations and counts: ``90s``, ``10m``, ``1.5h``, ``2e6``, ``5M``."""

from __future__ import annotations

from lmlab.utils.errors import LmlabError

_DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_COUNT_UNITS = {"k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "B": 1e9, "T": 1e12}


def parse_duration(text: str | float | int) -> float:
    """Seconds in a duration such as ``"90s"``, ``"10m"``, ``"1.5h"`` or a bare number of seconds."""
    if isinstance(text, int | float):
        return float(text)
    value = text.strip()
    try:
        if value and value[-1] in _DURATION_UNITS:
            return float(value[:-1]) * _DURATION_UNITS[value[-1]]
        return float(value)
    except ValueError:
        raise LmlabError(f"cannot read the duration {text!r}",
                         "write a number with an optional unit s, m, h or d, e.g. 10m or 1.5h") from None


def parse_count(text: str | float | int) -> int:
    """An integer count such as ``"2e6"``, ``"5M"``, ``"42B"`` or ``"1000"``."""
    if isinstance(text, int | float):
        return int(text)
    value = text.strip()
    try:
        if value and value[-1] in _COUNT_UNITS:
            return int(float(value[:-1]) * _COUNT_UNITS[value[-1]])
        return int(float(value))
    except ValueError:
        raise LmlabError(f"cannot read the count {text!r}",
                         "write a number such as 1000, 2e6, 5M or 42B") from None
