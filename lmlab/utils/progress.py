"""Progress bars for long work (tqdm on stderr; silenced with LMLAB_NO_PROGRESS=1)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any


def progress(iterable: Iterable | None = None, *, desc: str = "", total: float | None = None,
             unit: str = "it", **kwargs: Any):
    """A tqdm progress bar (disabled when LMLAB_NO_PROGRESS is set)."""
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, unit=unit, dynamic_ncols=True,
                disable=os.environ.get("LMLAB_NO_PROGRESS", "") not in ("", "0"), **kwargs)
