"""The training settings ``lmlab sentence train`` and ``lmlab seq2seq train`` share: both run the
Trainer under a :class:`~lmlab.training.config.TrainingConfig` built from the same flags
(``--lr --batch-size --warmup --steps --budget --seed --precision --threads --device``; each
keeps its own defaults), refuse the same bad counts, and print the same end-of-run JSON."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def training_config(args: argparse.Namespace, counts: Sequence[str], how_long: str) -> Any:
    """The run's ``TrainingConfig``, after checking that every flag named in ``counts`` (dest
    names: ``batch_size``) is at least 1 when given and that ``--steps`` or ``--budget`` says
    how long to train (``how_long``: an example for the fix, ``--steps 1000 or --budget 10m``).
    Evaluation and checkpoints every 500 steps."""
    from lmlab.training.config import TrainingConfig
    from lmlab.utils.checks import check_at_least
    from lmlab.utils.durations import parse_duration
    from lmlab.utils.errors import LmlabError

    for name in counts:
        check_at_least(getattr(args, name), 1, f"--{name.replace('_', '-')}")
    if args.steps is None and args.budget is None:
        raise LmlabError("neither --steps nor --budget was given",
                         f"say how long to train, e.g. {how_long}")
    return TrainingConfig(lr=args.lr, batch_size=args.batch_size, warmup_fraction=args.warmup,
                          max_steps=args.steps, seed=args.seed, precision=args.precision,
                          threads=args.threads, device=args.device,
                          budget_seconds=parse_duration(args.budget) if args.budget else None,
                          eval_every=500, save_every=500)


def print_trained(result: Any, out: str | Path) -> None:
    """The end of the run as JSON: steps, why it stopped, the last loss, the last evaluation
    and the folder of the trained model (``out/model``)."""
    print(json.dumps({"steps": result.step, "stop_reason": result.stop_reason,
                      "last_loss": result.last_loss, **result.last_eval,
                      "model": str(Path(out) / "model")}, indent=2))
