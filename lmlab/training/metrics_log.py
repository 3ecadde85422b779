"""``metrics.jsonl``: one JSON object per logged step (``train``), evaluation (``eval``) and
session end (``end``), plus optional TensorBoard; the records are listed in docs/training.md
("Run directory"). On resume the file is cut back to the checkpoint's step.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from lmlab.utils.io import atomic_write_text


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf
    return value


class MetricsWriter:
    """Append-only JSON-lines writer (line-buffered), mirrored to TensorBoard when available."""

    def __init__(self, path: Path, tensorboard_dir: Path | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - long-lived
        self._tb = None
        if tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(tensorboard_dir))
            except Exception:  # tensorboard not installed: skip silently
                self._tb = None

    def write(self, record: dict[str, Any]) -> None:
        record = {k: _clean(v) for k, v in record.items()}
        self._handle.write(json.dumps(record, sort_keys=True) + "\n")
        self._handle.flush()
        if self._tb is not None:
            prefix = record.get("kind", "train")
            for key, value in record.items():
                if isinstance(value, int | float) and key not in ("step", "kind"):
                    self._tb.add_scalar(f"{prefix}/{key}", value, record.get("step", 0))

    def close(self) -> None:
        self._handle.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl (a torn last line from a kill is skipped)."""
    path = Path(path)
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def truncate_metrics(path: Path, step: int) -> None:
    """Keep only the records of steps ``<= step`` (resuming from the checkpoint of ``step``),
    less "end" records: the run goes on, and writes its own end when it finishes."""
    path = Path(path)
    if not path.is_file():
        return
    kept = [r for r in read_metrics(path)
            if int(r.get("step", 0)) <= step and r.get("kind") != "end"]
    atomic_write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
