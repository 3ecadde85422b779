"""The cost package's figures of fact, read once from ``facts.json`` beside this module: GPU
data-sheet peaks and TDPs, the default grid carbon intensity and a CPU core's TDP share. The
file is the one source; docs/cost.md shows the same figures (a test keeps the two equal)."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any


@cache
def facts() -> dict[str, Any]:
    """The parsed ``lmlab/cost/facts.json`` (shipped as package data)."""
    return json.loads(resources.files("lmlab.cost").joinpath("facts.json").read_text("utf-8"))
