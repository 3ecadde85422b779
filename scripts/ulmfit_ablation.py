"""ULMFiT's stage ablation (Howard & Ruder 2018, tables 4 and 6) on lmlab's built-in tasks.

For every task and seed, from one general-domain AWD-LSTM (stage 1):

* ``full``: target-task LM fine-tuning (stage 2, on the task's training texts), then the
  classifier with the ``ulmfit`` recipe (concat pooling, discriminative rates, slanted
  triangular schedule, gradual unfreezing);
* ``without LM fine-tuning``: the classifier straight on the general LM;
* ``without gradual unfreezing``: stage 2, then the ``ulmfit-no-unfreeze`` recipe (every layer
  group trains from the first epoch).

    python scripts/ulmfit_ablation.py --general runs/awd --out runs/ulmfit-ablation
    python scripts/ulmfit_ablation.py --shards shards/ --pretrain-steps 2000 --out runs/abl
    python scripts/ulmfit_ablation.py --general runs/awd --tasks fortunes-topic --seeds 0 \\
        --lm-steps 20 --epochs 2 --max-train-examples 200 --out /tmp/abl      # a quick check

Resumable: every stage is a run directory under ``--out`` (``TASK/seed-N/lm``,
``TASK/seed-N/VARIANT``); a finished one is reused ("done already"), an interrupted one
resumes from its last checkpoint. The table (median and range over seeds of dev and test
accuracy) goes to ``--out/ablation.md``, every run's numbers to ``--out/ablation.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from lmlab.utils.errors import LmlabError

TASKS = ("wordnet-supersense", "fortunes-topic")
VARIANTS = {  # name -> (stage 2?, recipe)
    "full": (True, "ulmfit"),
    "without LM fine-tuning": (False, "ulmfit"),
    "without gradual unfreezing": (True, "ulmfit-no-unfreeze"),
}


def _slug(name: str) -> str:
    return name.replace(" ", "-")


def general_lm(args: argparse.Namespace, out: Path) -> Path:
    """Stage 1: ``--general``, or a fresh AWD-LSTM pretrained on ``--shards`` into out/general."""
    import lmlab

    if args.general:
        return Path(args.general)
    if not args.shards:
        raise LmlabError("no general-domain LM given", "pass --general RUN, or --shards SHARDS "
                         "(with --pretrain-steps) to pretrain one")
    run = out / "general"
    if not (run / "model" / "config.json").is_file():
        lmlab.pretrain(lmlab.PretrainConfig.from_sections(
            None, family="awd-lstm", size=args.size, objective="clm", shards=args.shards,
            out=str(run), max_steps=args.pretrain_steps, lr=args.pretrain_lr, seq_len=70,
            batch_size=32, schedule="triangular", precision=args.precision,
            progress=False, seed=0))
    return run


def load_task(name: str, args: argparse.Namespace):
    from lmlab.tasks import load_builtin_task
    from lmlab.tasks.sampling import sample_examples

    task = load_builtin_task(name)
    splits = dict(task.splits)
    if args.max_train_examples:
        splits["train"] = sample_examples(task.split("train"), args.max_train_examples)
    if args.max_eval_examples:
        for split in ("dev", "test"):
            splits[split] = sample_examples(task.split(split), args.max_eval_examples)
    return replace(task, splits=splits)


def run_one(task, general: Path, seed_dir: Path, variant: str, seed: int,
            args: argparse.Namespace) -> dict[str, Any]:
    """One variant of one seed (stage 2 shared by the variants that use it)."""
    from lmlab.finetune.runner import finetune
    from lmlab.finetune.ulmfit import finetune_lm
    from lmlab.utils.io import read_json

    out = seed_dir / _slug(variant)
    if (out / "metrics.json").is_file():
        print(f"{task.name} seed {seed} {variant}: done already", flush=True)
        return read_json(out / "metrics.json")
    lm_stage, recipe = VARIANTS[variant]
    source: Path = general
    if lm_stage:
        source = seed_dir / "lm"
        if not (source / "model" / "config.json").is_file():
            finetune_lm(task, general, source, args.lm_steps, args.lm_lr, seed=seed,
                        precision=args.precision)
    print(f"{task.name} seed {seed} {variant}: training", flush=True)
    return finetune(task, source, out, recipe=recipe, seed=seed, lr=args.lr,
                    epochs=args.epochs, batch_size=args.batch_size, precision=args.precision,
                    show_progress=False)


def _cell(values: list[float]) -> str:
    if not values:
        return "-"
    median = statistics.median(values) * 100
    if len(values) == 1:
        return f"{median:.1f}"
    return f"{median:.1f} ({min(values) * 100:.1f}-{max(values) * 100:.1f})"


def table(rows: list[dict[str, Any]], host: str, args: argparse.Namespace) -> str:
    lines = ["# ULMFiT stage ablation (provisional)", "",
             f"Host: {host}. Seeds: {args.seeds}. Stage 2: {args.lm_steps} steps at lr "
             f"{args.lm_lr}; stage 3: lr {args.lr}, epochs {args.epochs or 'recipe'}; "
             f"train examples: {args.max_train_examples or 'all'}, dev/test examples: "
             f"{args.max_eval_examples or 'all'}. Accuracy in %, median (min-max) over seeds.",
             "", "| task | variant | dev accuracy | test accuracy | seeds |",
             "|---|---|---:|---:|---:|"]
    for name in args.tasks.split(","):
        for variant in VARIANTS:
            mine = [r for r in rows if r["task"] == name and r["variant"] == variant]
            dev = [r["dev"] for r in mine if r.get("dev") is not None]
            test = [r["test"] for r in mine if r.get("test") is not None]
            lines.append(f"| {name} | {variant} | {_cell(dev)} | {_cell(test)} | {len(mine)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from lmlab.utils.host import describe_host
    from lmlab.utils.io import atomic_write_json, atomic_write_text

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--general", help="stage 1: an AWD-LSTM run directory or model folder")
    p.add_argument("--shards", help="without --general: pretrain one on these shards")
    p.add_argument("--size", default="mini", help="its size (awd-lstm preset)")
    p.add_argument("--pretrain-steps", type=int, default=2000)
    p.add_argument("--pretrain-lr", type=float, default=3e-3)
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--lm-steps", type=int, default=300, help="stage 2 steps")
    p.add_argument("--lm-lr", type=float, default=1e-3)
    p.add_argument("--lr", type=float, default=5e-3, help="stage 3 peak rate of the top group")
    p.add_argument("--epochs", type=int, help="stage 3 epochs (default: the recipe's 4)")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--max-train-examples", type=int)
    p.add_argument("--max-eval-examples", type=int, help="dev/test examples (default all)")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    out = Path(args.out)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        from lmlab.finetune.ulmfit import general_lm_folder

        general = general_lm(args, out)
        general_lm_folder(general)
        rows = []
        for name in args.tasks.split(","):
            task = load_task(name, args)
            metric = task.metrics[0]
            for seed in seeds:
                for variant in VARIANTS:
                    result = run_one(task, general, out / name / f"seed-{seed}", variant, seed,
                                     args)
                    rows.append({"task": name, "variant": variant, "seed": seed,
                                 "metric": metric,
                                 "dev": (result.get("dev") or {}).get(metric),
                                 "test": (result.get("test") or {}).get(metric)})
    except LmlabError as error:
        print(f"error: {error.problem}\nfix: {error.fix}", file=sys.stderr)
        return 2
    host = describe_host()
    atomic_write_json(out / "ablation.json", {"host": host, "rows": rows, "args": vars(args)})
    text = table(rows, host, args)
    atomic_write_text(out / "ablation.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
