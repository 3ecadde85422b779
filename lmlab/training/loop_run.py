"""A run directory for a training loop of its own (word2vec, GloVe): the Trainer's guarantees
(settings checked on resume, atomic checkpoints every ``checkpoint_seconds``, a time budget over
all sessions, a cost report) for loops that update tables in place without an optimizer.
docs/training.md ("Loops of their own") tells why and how.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lmlab.training import checkpoint as ckpt
from lmlab.training.run_dir import check_resumable, prepare_run_folder
from lmlab.training.schedules import estimate_horizon
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import atomic_write_json

# what a loop hands over at a checkpoint: (JSON-able position and RNG states, tensors)
LoopState = tuple[dict[str, Any], dict[str, torch.Tensor]]


@dataclass
class LoopModel:
    """What the cost report says about a loop's model (it stands in for a model config in the
    CostTracker; the loop passes each step's FLOPs)."""

    family: str
    parameters: int
    flop_counting: str
    unit: str  # what the report's "tokens seen" counts: "in-vocabulary words read", ...
    precision: str = "fp32"  # GloVe's tables are fp64: no measured peak, so no MFU

    def num_parameters(self) -> int:
        return self.parameters

    def flops_per_token(self, seq_len: int, **_: Any) -> float:
        return 0.0  # unused: every step passes its own FLOPs


class LoopRun:
    """The run directory ``out_dir`` (None: budget and cost report only) of a loop with
    result-changing ``hparams``; a folder that holds something else, or a run with other
    ``hparams``, is refused here unless ``overwrite``.

    Args:
        hparams: JSON-able; a ``schedule`` entry says whether the budget shapes the run.
        checkpoint_seconds: training time between checkpoints (0: every step).
        what: the run's name in refusals; ``option`` its folder's flag.
        outputs: files written outside the folder (``{"vectors": path}``), see :func:`writes`.
    """

    def __init__(self, out_dir: str | Path | None, hparams: dict[str, Any], *,
                 speed: dict[str, Any] | None = None, budget_seconds: float | None = None,
                 checkpoint_seconds: float = 60.0, overwrite: bool = False, what: str = "run",
                 option: str = "--out", cost_settings: dict[str, float] | None = None,
                 outputs: dict[str, str] | None = None):
        if budget_seconds is not None and not budget_seconds > 0:
            raise LmlabError(f"the budget must be positive, got {budget_seconds}",
                             "give a duration such as --budget 10m")
        if not checkpoint_seconds >= 0:
            raise LmlabError(f"the time between checkpoints must be >= 0, got "
                             f"{checkpoint_seconds}", "give a duration such as 1m (or 0)")
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.config: dict[str, Any] = json.loads(json.dumps({
            "hparams": {**hparams, "budget_seconds": budget_seconds},
            "speed": dict(speed or {}), "outputs": dict(outputs or {})}))
        self.budget_seconds = budget_seconds
        self.checkpoint_seconds = checkpoint_seconds
        self.cost_settings = dict(cost_settings or {})
        self.option = option
        self.step = 0
        self.elapsed_before = 0.0
        self._saved_at = 0.0  # elapsed() at the last checkpoint
        self._session_start: float | None = None
        self._tracker: Any = None
        self._model: LoopModel | None = None
        if self.out_dir is not None:
            prepare_run_folder(self.out_dir, overwrite, self.config, what, option)

    @property
    def keeps_checkpoints(self) -> bool:
        """Whether the run has a folder (else it has a budget and a cost report only)."""
        return self.out_dir is not None

    def check_data(self, fingerprint: str | None) -> None:
        """Record the data's fingerprint; refuse a run in ``out_dir`` that read other data."""
        if fingerprint is None:
            return
        self.config["data"] = {"corpus_fingerprint": fingerprint}
        if self.out_dir is not None:
            check_resumable(self.out_dir, self.config, self.option)

    def resume(self) -> LoopState | None:
        """The newest checkpoint's (state, tensors), or None (a new run)."""
        path = (ckpt.latest_checkpoint(self.out_dir / "checkpoints") if self.out_dir is not None
                else None)
        if path is None:
            return None
        state = ckpt.read_state(path)
        self.step = int(state["step"])
        self.elapsed_before = self._saved_at = float(state["elapsed"])
        print(f"lmlab: resuming from {path} (step {self.step:,})", flush=True)
        return state["loop"], ckpt.load_state(path / "state.safetensors")

    def start(self, model: LoopModel) -> None:
        """Write ``config.json``, start the clock and the cost tracker (after :meth:`resume`)."""
        from lmlab.cost.report import CostTracker
        from lmlab.utils.host import describe_host

        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.out_dir / "config.json", {
                **self.config, "cost": self.cost_settings, "host": describe_host()})
        self._tracker = CostTracker(model, seq_len=1, measure_peak=False,
                                    **self.cost_settings).start()
        self._model = model
        self._session = uuid.uuid4().hex[:12]  # names this session's cost records
        self._session_start = time.perf_counter()

    def elapsed(self) -> float:
        """Seconds the loop has trained, over all its sessions (what the budget bounds)."""
        return self.elapsed_before + (time.perf_counter() - self._session_start)

    def out_of_time(self) -> bool:
        """Whether the budget is spent (a resumed run that its budget had stopped)."""
        return self.budget_seconds is not None and self.elapsed() >= self.budget_seconds

    def horizon(self, done: float, planned: float) -> float:
        """The horizon in the loop's units: ``planned``, or less where the budget ends first."""
        if self.budget_seconds is None:
            return planned
        return estimate_horizon(int(done), 0, self.elapsed(), int(planned), None,
                                self.budget_seconds)

    def after_step(self, units: int, flops: float, state: Callable[[], LoopState]) -> str | None:
        """Count one step, checkpoint when one is due (``state`` builds it); returns
        ``"budget"`` (after a final checkpoint) once the budget is spent."""
        self.step += 1
        self._tracker.add_tokens(units, flops=flops)
        if self.out_of_time():
            self.save(state(), "budget")
            return "budget"
        if self.elapsed() - self._saved_at >= self.checkpoint_seconds:
            self.save(state())
        return None

    def save(self, loop_state: LoopState, stop_reason: str | None = None) -> None:
        """Write ``checkpoints/step-N`` atomically (the final one with its ``stop_reason``)."""
        if self.out_dir is None:
            return
        state, tensors = loop_state
        tmp = ckpt.staging_dir(self.out_dir / "checkpoints", self.step)
        ckpt.save_state(tensors, tmp / "state.safetensors")
        record = {"step": self.step, "elapsed": self.elapsed(), "loop": state}
        if stop_reason is not None:
            record["stop_reason"] = stop_reason
        (tmp / "state.json").write_text(json.dumps(record, sort_keys=True) + "\n",
                                        encoding="utf-8")
        ckpt.commit(tmp, keep_last=1)
        self._saved_at = record["elapsed"]
        if stop_reason is None:  # the cost so far survives a kill (lmlab cost project)
            self._tracker.report().log_session(self.out_dir, self._session, "running",
                                               step=self.step)

    def finish(self, loop_state: LoopState | None, stop_reason: str) -> Any:
        """A final checkpoint with ``stop_reason`` (None state: written already), then this
        session's cost report (``cost.json``, ``cost.md``), returned."""
        if loop_state is not None:
            self.save(loop_state, stop_reason)
        self._tracker.stop()
        report = self._tracker.report()
        report.notes.append(f"Tokens seen here are {self._model.unit}; MFU is shown where this "
                            "host's peak was measured before (lmlab cost peak).")
        if self._model.precision != "fp32":  # the tracker measured against the fp32 peak
            report.precision, report.mfu, report.peak_flops_per_s = self._model.precision, None, None
            report.peak_label = f"no {self._model.precision} peak is measured"
        if self.out_dir is not None:
            report.write(self.out_dir)
            report.log_session(self.out_dir, self._session, "finished", stop_reason=stop_reason,
                               step=self.step)
        return report


def writes(out_dir: str | Path | None, name: str, path: str | Path) -> bool:
    """Whether the run in ``out_dir`` has a checkpoint and records ``path`` as its output
    ``name`` (resuming may then replace that file without ``--overwrite``)."""
    if out_dir is None or ckpt.latest_checkpoint(Path(out_dir) / "checkpoints") is None:
        return False
    try:
        config = json.loads((Path(out_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (config.get("outputs") or {}).get(name) == str(Path(path).resolve())
