"""Ranges of the fine-tuning settings, checked before a model is loaded (torch-free).

:func:`lmlab.finetune.runner.finetune` and ``lmlab finetune`` call :func:`check_settings`, so
the API and the command refuse the same value with the same error. ``None`` means "the
recipe's default" and always passes.
"""

from __future__ import annotations

from lmlab.utils.checks import check_at_least, check_positive

# setting -> (the option that sets it on the command line, smallest allowed value)
MINIMUMS = {"epochs": ("--epochs", 1), "batch_size": ("--batch-size", 1),
            "max_length": ("--max-length", 2), "max_train_examples": ("--max-train-examples", 1),
            "patience": ("--patience", 1), "save_every": ("--save-every", 1),
            "min_updates": ("--min-updates", 0)}
POSITIVE = {"lr": "--lr", "budget_seconds": "--budget", "head_lr_multiplier": "--head-lr-multiplier"}


def check_settings(**settings: float | None) -> None:
    """Raise :class:`~lmlab.utils.errors.LmlabError` on a setting out of its range, e.g.
    ``check_settings(epochs=0)`` -> "--epochs must be at least 1, got 0"."""
    for name, value in settings.items():
        if name in MINIMUMS:
            option, minimum = MINIMUMS[name]
            check_at_least(value, minimum, option)
        elif name in POSITIVE:
            check_positive(value, POSITIVE[name])
        else:
            raise KeyError(name)
