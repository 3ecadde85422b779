"""Cached stages: each stage's output lives in a folder named by a hash of its inputs.

A finished stage writes ``DONE.json`` last; a rerun with the same inputs reuses it. A stage
killed mid-way starts over, except a resumable one (pretraining), which continues from its
checkpoint; docs/demo.md, "Caching and interruption".
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmlab.utils.io import atomic_write_json, stable_hash


@dataclass
class StageLog:
    """What happened to each stage in this invocation (for the report and the summary)."""

    entries: list[dict[str, Any]] = field(default_factory=list)

    def add(self, name: str, folder: Path, cached: bool, seconds: float,
            recorded: float) -> None:
        """``seconds``: this invocation's time on the stage (0 when cached); ``recorded``: the
        time the stage took when it ran (the same number on every rerun)."""
        self.entries.append({"stage": name, "folder": str(folder), "cached": cached,
                             "seconds": round(seconds, 1), "recorded_seconds": round(recorded, 1)})

    def recorded_seconds(self, *fragments: str) -> float:
        """The recorded time of the stages so far whose names contain every fragment."""
        return sum(entry["recorded_seconds"] for entry in self.entries
                   if all(fragment in entry["stage"] for fragment in fragments))


class StageRunner:
    def __init__(self, root: str | Path, fresh: bool = False, log: StageLog | None = None):
        self.root = Path(root) / "stages"
        self.root.mkdir(parents=True, exist_ok=True)
        self.fresh = fresh
        self.log = log or StageLog()

    def folder(self, name: str, inputs: dict[str, Any]) -> Path:
        return self.root / f"{name}-{stable_hash(inputs)}"

    def run(self, name: str, inputs: dict[str, Any], work: Callable[[Path], Any],
            resumable: bool = False) -> tuple[Path, Any]:
        """Run ``work(folder)`` unless a finished result for these inputs exists.

        Returns (folder, result); ``result`` is what ``work`` returned (JSON-serialisable),
        read back from ``DONE.json`` when cached.
        """
        folder = self.folder(name, inputs)
        done = folder / "DONE.json"
        started = time.perf_counter()
        if done.exists() and not self.fresh:
            record = json.loads(done.read_text())
            self.log.add(name, folder, True, 0.0, record.get("seconds", 0.0))
            return folder, record["result"]
        if folder.exists() and (self.fresh or not resumable):
            shutil.rmtree(folder)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(folder / "inputs.json", inputs)
        result = work(folder)
        seconds = time.perf_counter() - started
        atomic_write_json(done, {"result": result, "seconds": seconds})
        self.log.add(name, folder, False, seconds, seconds)
        return folder, result
