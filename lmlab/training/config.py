"""TrainingConfig: every setting of a training run, split into what changes the result and what
only changes its speed.

Cramming's lesson: a run's result must be reproducible from its *hyperparameters* alone, while
*speed settings* (threads, compile, workers, skipping padding, distribution strategy, how often
to log or checkpoint) may be changed freely. ``config.json`` in a run directory and a ``--config``
file both have two sections, ``hparams:`` and ``speed:``. Precision is filed under speed because
it is chosen for speed, but bf16 *does* change the numbers; its effect is measured and reported
(docs/benchmarks-pretraining.md), not assumed away.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmlab.utils.errors import LmlabError

SCHEDULES = ("linear", "cosine", "constant", "inverse_sqrt", "triangular")
PRECISIONS = ("fp32", "bf16", "auto")  # auto: lmlab.cost.precision.auto_precision
STRATEGIES = ("auto", "ddp", "fsdp")


def _speed(default: Any) -> Any:
    """A dataclass field filed under the ``speed`` section."""
    return field(default=default, metadata={"section": "speed"})


@dataclass
class TrainingConfig:
    """Optimiser, schedule, stopping rule and run settings of one training run.

    A run stops at the first of ``max_steps``, ``max_tokens`` and ``budget_seconds`` that is
    reached (at least one must be set). ``batch_size`` and ``seq_len`` describe the stream the
    trainer is given (the global batch under DDP); they are recorded for the report and the cost
    accounting, the stream itself decides what a batch is.
    """

    # -- hyperparameters (change the result) ---------------------------------------------------
    lr: float = 1e-4
    schedule: str = "linear"
    warmup_steps: int | None = None  # optimizer steps; takes precedence over warmup_fraction
    warmup_fraction: float = 0.0  # of the run's horizon (steps, tokens or time budget)
    min_lr_ratio: float = 0.0  # floor of linear/cosine decay, as a fraction of lr
    cut_frac: float = 0.1  # triangular (ULMFiT): fraction of the run spent increasing the LR
    ratio: float = 32.0  # triangular: how much smaller the lowest LR is than the peak
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6
    grad_accum: int = 1
    clip_norm: float | None = 1.0
    max_steps: int | None = None
    max_tokens: int | None = None
    budget_seconds: float | None = None
    batch_size: int = 32
    seq_len: int = 128
    seed: int = 0
    # -- speed settings (do not change the result beyond floating-point noise) ----------------
    precision: str = _speed("fp32")
    compile: bool = _speed(False)
    threads: int | None = _speed(None)
    workers: int = _speed(0)
    skip_padding: bool = _speed(True)  # False: the stack computes padding positions too
    strategy: str = _speed("auto")  # auto: DDP when launched by torchrun; fsdp on request
    device: str = _speed("auto")
    log_every: int = _speed(10)
    eval_every: int | None = _speed(None)
    save_every: int | None = _speed(None)
    keep_last: int = _speed(2)
    progress: bool = _speed(True)

    def __post_init__(self) -> None:
        self.betas = tuple(float(b) for b in self.betas)  # type: ignore[assignment]
        self.validate()

    def _check_types(self) -> None:
        """Numbers must be numbers: a config file's ``lr: 1e-3`` is text to YAML 1.1 (it wants
        ``1.0e-3``), and comparing text with a number would fail with a traceback. They must
        be finite too: ``nan`` passes every ``<`` check, and ``--lr inf`` trains to NaN."""
        for f in dataclasses.fields(self):
            value, kind = getattr(self, f.name), str(f.type)
            if value is None and "None" in kind:
                continue
            if kind.startswith("float") and (isinstance(value, bool)
                                             or not isinstance(value, int | float)):
                raise LmlabError(f"{f.name} must be a number, got {value!r}",
                                 f"write {f.name} as a number (in YAML: 1.0e-3, not 1e-3)")
            if kind.startswith("float") and not math.isfinite(value):
                raise LmlabError(f"{f.name} must be a finite number, got {value!r}",
                                 f"give {f.name} a finite value")
            if kind.startswith("int") and (isinstance(value, bool) or not isinstance(value, int)):
                raise LmlabError(f"{f.name} must be a whole number, got {value!r}",
                                 f"write {f.name} as a whole number, e.g. 1")

    def validate(self) -> None:
        """Raise :class:`LmlabError` on values that cannot work."""
        self._check_types()
        if self.schedule not in SCHEDULES:
            raise LmlabError(f"unknown learning-rate schedule {self.schedule!r}",
                             f"use one of: {', '.join(SCHEDULES)}")
        if self.precision not in PRECISIONS:
            raise LmlabError(f"unknown precision {self.precision!r}",
                             f"use one of: {', '.join(PRECISIONS)}")
        if self.strategy not in STRATEGIES:
            raise LmlabError(f"unknown distribution strategy {self.strategy!r}",
                             f"use one of: {', '.join(STRATEGIES)}")
        if self.max_steps is None and self.max_tokens is None and self.budget_seconds is None:
            raise LmlabError("the run has no end: none of max_steps, max_tokens, budget_seconds "
                             "is set", "give a step count, a token count or a time budget "
                             "(e.g. --budget 10m)")
        for name in ("max_steps", "max_tokens", "budget_seconds"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise LmlabError(f"{name} must be positive, got {value}", f"set {name} > 0")
        if self.grad_accum < 1:
            raise LmlabError(f"grad_accum must be >= 1, got {self.grad_accum}", "set it to 1 or more")
        if self.lr <= 0:
            raise LmlabError(f"lr must be positive, got {self.lr}", "set a learning rate > 0")
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise LmlabError(f"warmup_fraction must be in [0, 1), got {self.warmup_fraction}",
                             "give a fraction such as 0.06, or warmup_steps")
        if self.schedule == "triangular" and not 0.0 < self.cut_frac < 1.0:
            raise LmlabError(f"cut_frac must be in (0, 1), got {self.cut_frac}",
                             "ULMFiT uses cut_frac=0.1")
        if self.keep_last < 1:
            raise LmlabError(f"keep_last must be >= 1, got {self.keep_last}",
                             "keep at least the last checkpoint")
        for name, minimum in (("batch_size", 1), ("seq_len", 1), ("log_every", 1),
                              ("eval_every", 1), ("save_every", 1), ("threads", 1),
                              ("workers", 0), ("warmup_steps", 0)):
            value = getattr(self, name)
            if value is not None and value < minimum:
                raise LmlabError(f"{name} must be >= {minimum}, got {value!r}",
                                 f"set {name} to {minimum} or more")
        if not all(0.0 <= beta < 1.0 for beta in self.betas) or len(self.betas) != 2:
            raise LmlabError(f"betas must be two numbers in [0, 1), got {list(self.betas)}",
                             "use e.g. [0.9, 0.999]")
        if self.eps < 0:
            raise LmlabError(f"eps must be >= 0, got {self.eps}", "use e.g. 1.0e-6")
        if self.weight_decay < 0:
            raise LmlabError(f"weight_decay must be >= 0, got {self.weight_decay}",
                             "use 0 (off) or e.g. 0.01")
        if self.clip_norm is not None and self.clip_norm <= 0:
            raise LmlabError(f"clip_norm must be positive, got {self.clip_norm}",
                             "use e.g. 1.0, or leave it unset (null) for no clipping")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise LmlabError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}",
                             "use 0 (decay to zero) or e.g. 0.1")
        if self.device != "auto":
            parse_device(self.device)

    # -- sections -------------------------------------------------------------------------------
    @classmethod
    def section_of(cls, name: str) -> str:
        """``"hparams"`` or ``"speed"``: the section a field belongs to."""
        for f in dataclasses.fields(cls):
            if f.name == name:
                return f.metadata.get("section", "hparams")
        raise KeyError(name)

    def to_sections(self) -> dict[str, dict[str, Any]]:
        """``{"hparams": {...}, "speed": {...}}`` (JSON-able)."""
        out: dict[str, dict[str, Any]] = {"hparams": {}, "speed": {}}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.metadata.get("section", "hparams")][f.name] = (
                list(value) if isinstance(value, tuple) else value)
        return out

    @classmethod
    def from_sections(cls, sections: dict[str, Any]) -> TrainingConfig:
        """Build from ``{"hparams": {...}, "speed": {...}}``; unknown keys are errors, and a key in
        the wrong section is an error too (so a config file says what it means)."""
        known = {f.name: f.metadata.get("section", "hparams") for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for section in ("hparams", "speed"):
            for key, value in (sections.get(section) or {}).items():
                if key not in known:
                    continue  # other sections' readers (model, data) own unknown keys
                if known[key] != section:
                    raise LmlabError(f"{key!r} is a {known[key]} setting but sits under {section}:",
                                     f"move it under {known[key]}:")
                values[key] = value
        return cls(**values)

    def replace(self, **changes: Any) -> TrainingConfig:
        return dataclasses.replace(self, **changes)

    @staticmethod
    def field_names() -> list[str]:
        return [f.name for f in dataclasses.fields(TrainingConfig)]


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML or JSON run config with ``hparams:`` and ``speed:`` sections (and an
    optional ``cost:`` section: price per hour and grid intensity for the cost report)."""
    path = Path(path)
    if not path.is_file():
        raise LmlabError(f"config file {path} does not exist", "pass an existing .yaml or .json")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        import json

        data = json.loads(text)
    else:
        import yaml

        data = yaml.safe_load(text)
    if not isinstance(data, dict) or not ({"hparams", "speed"} & set(data)):
        raise LmlabError(f"config file {path} has no hparams: or speed: section",
                         "write two sections, hparams: (result-changing) and speed: (speed-only)")
    extra = sorted(set(data) - {"hparams", "speed", "cost"})
    if extra:
        raise LmlabError(f"config file {path} has unknown sections: {', '.join(extra)}",
                         "use only hparams:, speed: and cost:")
    return data


def parse_device(name: str) -> Any:
    """The ``torch.device`` that ``name`` names (``cpu``, ``cuda``, ``cuda:1``, ``mps``), whatever
    this machine has, so that a config stays valid on another host; anything else is refused.
    :func:`lmlab.training.distributed.resolve_device` then checks that the device is there."""
    import torch

    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda", "mps"):
        raise LmlabError(f"unknown device {name!r}", "use auto, cpu, cuda or cuda:N (or mps)")
    return device
