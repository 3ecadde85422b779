"""The settings of a fine-tuning run, typed and checked once, before any model loads.

:class:`FinetuneConfig` is what :func:`lmlab.finetune.runner.finetune` takes (or builds from its
keyword arguments) and what ``lmlab finetune`` builds from its flags or a ``--config`` file, so
the API and the command refuse the same value with the same error. ``None`` means "the
recipe's default" and always passes.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from lmlab.utils.checks import check_at_least, check_choice, check_names, check_positive
from lmlab.utils.errors import LmlabError

# setting -> (the option that sets it on the command line, smallest allowed value)
MINIMUMS = {"epochs": ("--epochs", 1), "batch_size": ("--batch-size", 1),
            "max_length": ("--max-length", 2), "max_train_examples": ("--max-train-examples", 1),
            "patience": ("--patience", 1), "save_every": ("--save-every", 1),
            "min_updates": ("--min-updates", 0), "head_hidden": ("--head-hidden", 1)}
POSITIVE = {"lr": "--lr", "budget_seconds": "--budget", "head_lr_multiplier": "--head-lr-multiplier"}


@dataclass(frozen=True)
class FinetuneConfig:
    """Everything :func:`~lmlab.finetune.runner.finetune` takes besides the task, the model and
    the run folder (docs/finetuning.md describes each)."""

    recipe: str | None = None  # None: bert for a pretrained model, scratch for a random one
    seed: int = 0
    epochs: int | None = None  # given alone: exactly that many (no min_updates)
    lr: float | None = None
    batch_size: int | None = None
    max_train_examples: int | None = None
    budget_seconds: float | None = None
    precision: str = "fp32"  # or auto: bf16 where this host runs it measurably faster
    random_init: bool = False
    layer: int | str | None = None  # the feature recipe's layer or strategy; None: scalar mix
    pooling: str | None = None
    max_length: int | None = None
    patience: int | None = None
    eval_splits: tuple[str, ...] = ("dev", "test")
    save_model: bool = True
    show_progress: bool = True
    device: str = "auto"
    activation_checkpointing: bool = False  # a speed setting (docs/training.md)
    save_every: int | None = None
    overwrite: bool = False
    head_lr_multiplier: float | None = None
    min_updates: int | None = None
    head_hidden: int | None = None  # ULMFiT's 50-unit batch-norm layer before the classifier
    distil: Any = None  # a lmlab.compress.distil.TaskDistillation
    method: str | None = None  # lora, adapter, bitfit, prompt, prefix (lmlab.adapt)
    method_options: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        from lmlab.finetune.recipes import RECIPES
        from lmlab.training.config import PRECISIONS

        for name, (option, minimum) in MINIMUMS.items():
            check_at_least(getattr(self, name), minimum, option)
        for name, option in POSITIVE.items():
            check_positive(getattr(self, name), option)
        check_choice(self.precision, PRECISIONS, "--precision", "precision")
        if not isinstance(self.activation_checkpointing, bool):
            raise LmlabError(f"activation_checkpointing must be true or false, got "
                             f"{self.activation_checkpointing!r}",
                             "write activation_checkpointing: true (or false)")
        if self.recipe is not None:
            check_choice(self.recipe, RECIPES, "--recipe", "recipe")
        if self.method is not None or self.method_options:
            from lmlab.adapt import method_settings

            method_settings(self.method, dict(self.method_options or {}))

    @classmethod
    def from_sections(cls, sections: dict[str, Any] | None = None,
                      **overrides: Any) -> FinetuneConfig:
        """A config from a config file's ``hparams:`` and ``speed:`` sections with
        ``overrides`` on top (``None`` ones are ignored, as unset flags are); ``budget_seconds``
        may be a duration such as ``"10m"``."""
        from lmlab.utils.durations import parse_duration

        sections = sections or {}
        values = {**(sections.get("hparams") or {}), **(sections.get("speed") or {})}
        values.update({k: v for k, v in overrides.items() if v is not None})
        check_names(sorted(values), [f.name for f in fields(cls)], "config", "setting")
        if isinstance(values.get("budget_seconds"), str):
            values["budget_seconds"] = parse_duration(values["budget_seconds"])
        if "eval_splits" in values:
            values["eval_splits"] = tuple(values["eval_splits"])
        return cls(**values)

    @classmethod
    def from_file(cls, path: str | Path, **overrides: Any) -> FinetuneConfig:
        """A config from a YAML or JSON file (see :meth:`from_sections`)."""
        from lmlab.training.config import load_config_file

        return cls.from_sections(load_config_file(path), **overrides)
