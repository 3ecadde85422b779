"""TrainingConfig: every setting of a training run, in two sections: ``hparams`` (change the
result) and ``speed`` (may change freely; precision is filed here though bf16 changes the
numbers, docs/benchmarks-pretraining.md). docs/training.md tells the story.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmlab.utils.checks import check_at_least, check_choice, check_positive
from lmlab.utils.errors import LmlabError

SCHEDULES = ("linear", "cosine", "constant", "inverse_sqrt", "triangular")
PRECISIONS = ("fp32", "bf16", "auto")  # auto: lmlab.cost.precision.auto_precision
STRATEGIES = ("auto", "ddp", "fsdp")


def _speed(default: Any) -> Any:
    """A dataclass field filed under the ``speed`` section."""
    return field(default=default, metadata={"section": "speed"})


@dataclass
class TrainingConfig:
    """Optimiser, schedule, stopping rule (the first of ``max_steps``, ``max_tokens``,
    ``budget_seconds``) and run settings; ``batch_size`` and ``seq_len`` describe the stream
    (the global batch under DDP) for the report and the cost accounting."""

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
    # ULMFiT's discriminative rates, lr / lr_decay**depth by the model's layer groups (2.6);
    # None: one rate. optimizer None: AdamW; "nt-asgd": AWD-LSTM's (lmlab.training.ntasgd)
    lr_decay: float | None = None
    optimizer: str | None = None
    # -- speed settings (do not change the result beyond floating-point noise) ----------------
    precision: str = _speed("fp32")
    compile: bool = _speed(False)
    threads: int | None = _speed(None)
    workers: int = _speed(0)
    skip_padding: bool = _speed(True)  # False: the stack computes padding positions too
    activation_checkpointing: bool = _speed(False)  # recompute layers in backward: less memory
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
        """Numbers must be finite numbers (YAML 1.1 reads ``1e-3`` as text; ``nan`` passes
        every ``<`` check)."""
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
            if kind.startswith("bool") and not isinstance(value, bool):
                raise LmlabError(f"{f.name} must be true or false, got {value!r}",
                                 f"write {f.name}: true or {f.name}: false")

    def validate(self) -> None:
        """Raise :class:`LmlabError` on values that cannot work."""
        self._check_types()
        check_choice(self.schedule, SCHEDULES, "schedule", "learning-rate schedule")
        check_choice(self.precision, PRECISIONS, "precision", "precision")
        check_choice(self.strategy, STRATEGIES, "strategy", "distribution strategy")
        if self.optimizer is not None:
            check_choice(self.optimizer, ("adamw", "nt-asgd"), "optimizer", "optimizer")
        if self.lr_decay is not None and not self.lr_decay >= 1.0:
            raise LmlabError(f"lr_decay must be at least 1, got {self.lr_decay}",
                             "ULMFiT divides the rate by 2.6 per layer group down")
        if self.max_steps is None and self.max_tokens is None and self.budget_seconds is None:
            raise LmlabError("the run has no end: none of max_steps, max_tokens, budget_seconds "
                             "is set", "give a step count, a token count or a time budget "
                             "(e.g. --budget 10m)")
        for name in ("max_steps", "max_tokens", "budget_seconds", "lr"):
            check_positive(getattr(self, name), name)
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise LmlabError(f"warmup_fraction must be in [0, 1), got {self.warmup_fraction}",
                             "give a fraction such as 0.06, or warmup_steps")
        if self.schedule == "triangular" and not 0.0 < self.cut_frac < 1.0:
            raise LmlabError(f"cut_frac must be in (0, 1), got {self.cut_frac}",
                             "ULMFiT uses cut_frac=0.1")
        for name, minimum in (("grad_accum", 1), ("keep_last", 1), ("batch_size", 1),
                              ("seq_len", 1), ("log_every", 1), ("eval_every", 1),
                              ("save_every", 1), ("threads", 1), ("workers", 0),
                              ("warmup_steps", 0), ("eps", 0), ("weight_decay", 0)):
            check_at_least(getattr(self, name), minimum, name)
        if not all(0.0 <= beta < 1.0 for beta in self.betas) or len(self.betas) != 2:
            raise LmlabError(f"betas must be two numbers in [0, 1), got {list(self.betas)}",
                             "use e.g. [0.9, 0.999]")
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
        """Build from ``{"hparams": {...}, "speed": {...}}``; a key in the wrong section is
        refused (unknown keys belong to other sections' readers)."""
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

    @staticmethod
    def field_names() -> list[str]:
        return [f.name for f in dataclasses.fields(TrainingConfig)]


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML or JSON run config (``hparams:``, ``speed:``, optional ``cost:``)."""
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
    """The ``torch.device`` ``name`` names (cpu, cuda, cuda:N, mps), whatever this machine has
    (:func:`~lmlab.training.distributed.resolve_device` checks it is there)."""
    import torch

    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda", "mps"):
        raise LmlabError(f"unknown device {name!r}", "use auto, cpu, cuda or cuda:N (or mps)")
    return device
