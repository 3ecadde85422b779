"""The BERT paper's feature-based comparison (Devlin et al. 2019, table 7) with MiniLM frozen.

The encoder never trains: its per-layer sentence vectors (embeddings + each layer, mean-pooled)
are computed once per split, and a linear head (the ``feature`` recipe: AdamW, dev scored every
epoch, best epoch kept, early stopping) is trained on each way of combining the layers, the
strategies of :data:`lmlab.models.pooling.STRATEGIES` plus ELMo's learned scalar mix, for
every seed. The paper's ordering on CoNLL-2003 NER: concat of the last four ~= fine-tuning, then
weighted sum / sum of the last four / second-to-last / last close together, embeddings far below.

    python scripts/feature_strategies.py                                    # wordnet-supersense
    python scripts/feature_strategies.py --task fortunes-topic --seeds 0
    python scripts/feature_strategies.py --max-train-examples 200 --out /tmp/t7.json

Each run's Trainer files go under ``--runs`` (``STRATEGY/seed-N/``; a finished run is reused,
an interrupted one resumes); the summary (median and spread over seeds, per split) is printed
as a Markdown table and written to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

from lmlab.finetune.feature_based import task_features, train_feature_based
from lmlab.finetune.recipes import get_recipe
from lmlab.finetune.results import summarize_seeds
from lmlab.finetune.train import RunOptions
from lmlab.models.pooling import STRATEGIES
from lmlab.tasks import load_builtin_task
from lmlab.tasks.sampling import sample_examples
from lmlab.utils.catalog import minilm_dir
from lmlab.utils.errors import LmlabError
from lmlab.utils.host import describe_host
from lmlab.utils.io import atomic_write_json

SCALAR_MIX = "scalar_mix"  # the learned ELMo mix (the recipe's layer=None)
STRATEGY_NAMES = (*STRATEGIES, SCALAR_MIX)
TASKS = ("wordnet-supersense", "fortunes-topic")


def run_strategies(task, model, tokenizer, strategies, seeds, runs: Path,
                   precision: str = "fp32") -> dict[str, list[dict[str, Any]]]:
    """``{strategy: [row per seed]}``; a row holds the dev and test metrics and the run's
    steps, best epoch and seconds. The frozen features are computed once for all runs."""
    rec = get_recipe("feature")
    started = time.perf_counter()
    features = {split: task_features(task, split, model, tokenizer, rec, precision)
                for split in ("train", "dev", "test")}  # each (N, L+1, H)
    print(f"features of {', '.join(f'{s} {tuple(v.shape)}' for s, v in features.items())} "
          f"in {time.perf_counter() - started:.0f} s", flush=True)
    rows: dict[str, list[dict[str, Any]]] = {}
    for strategy in strategies:
        recipe = dataclasses.replace(rec, layer=None if strategy == SCALAR_MIX else strategy)
        for seed in seeds:
            started = time.perf_counter()
            result = train_feature_based(task, model, tokenizer, recipe, seed,
                                         runs / strategy / f"seed-{seed}",
                                         RunOptions(precision, progress=False),
                                         features=features)
            predict = result.predict
            row = {"strategy": strategy, "seed": seed,
                   "dev": task.evaluate("dev", predict("dev")),
                   "test": task.evaluate("test", predict("test")),
                   "best_epoch": result["best_epoch"], "steps": result["steps"],
                   "seconds": time.perf_counter() - started}
            rows.setdefault(strategy, []).append(row)
            metric = task.metrics[0]
            print(f"{strategy:<18} seed {seed}: dev {metric} {row['dev'][metric]:.4f}  "
                  f"test {row['test'][metric]:.4f}  ({row['seconds']:.0f} s)", flush=True)
    return rows


def summarize(rows: dict[str, list[dict[str, Any]]], metric: str) -> dict[str, dict[str, Any]]:
    """Median and spread of ``metric`` over seeds, per strategy and split."""
    return {strategy: {split: summarize_seeds(runs, split)[metric] for split in ("dev", "test")}
            for strategy, runs in rows.items()}


def render(summary: dict[str, dict[str, Any]], metric: str) -> str:
    """A Markdown table: median (spread) x 100 on dev and test, best dev first."""
    lines = [f"| strategy | dev {metric} | test {metric} |", "|---|---|---|"]
    for strategy, split in sorted(summary.items(), key=lambda kv: -kv[1]["dev"]["median"]):
        cells = [f"{100 * split[s]['median']:.1f} ({100 * split[s]['spread']:.1f})"
                 for s in ("dev", "test")]
        lines.append(f"| `{strategy}` | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="wordnet-supersense", choices=TASKS)
    parser.add_argument("--strategies", default=",".join(STRATEGY_NAMES))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--max-train-examples", type=int,
                        help="a stratified sample of the training split (quick looks only)")
    parser.add_argument("--max-eval-examples", type=int,
                        help="a stratified sample of dev and of test (quick looks only)")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"),
                        help="of the frozen encoder's pass (the heads train in fp32)")
    parser.add_argument("--runs", default="runs/feature-strategies",
                        help="the runs' Trainer files (STRATEGY/seed-N/)")
    parser.add_argument("--out", help="write the rows and summary here (JSON)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    args = parser.parse_args(argv)
    strategies = args.strategies.split(",")
    unknown = [s for s in strategies if s not in STRATEGY_NAMES]
    if unknown:
        parser.error(f"unknown strategies {', '.join(unknown)}: use {', '.join(STRATEGY_NAMES)}")
    try:
        seeds = tuple(int(s) for s in args.seeds.split(","))
    except ValueError:
        parser.error(f"--seeds {args.seeds!r}: give comma-separated integers, e.g. 0,1,2")
    for option, value in (("--max-train-examples", args.max_train_examples),
                          ("--max-eval-examples", args.max_eval_examples)):
        if value is not None and value < 1:
            parser.error(f"{option} must be at least 1")
    if args.out and Path(args.out).exists() and not args.overwrite:
        parser.error(f"--out {args.out} already exists (pass --overwrite to replace it)")
    runs = (Path(args.runs) / args.task / f"train-{args.max_train_examples or 'all'}"
            f"-eval-{args.max_eval_examples or 'all'}")
    if minilm_dir() is None:
        raise SystemExit("the MiniLM checkpoint is not available (lmlab.utils.paths.minilm_dir)")
    import lmlab

    task = load_builtin_task(args.task, "cpu")
    limits = {"train": args.max_train_examples, "dev": args.max_eval_examples,
              "test": args.max_eval_examples}
    task = dataclasses.replace(task, splits={
        **task.splits, **{split: sample_examples(task.split(split), limit)
                          for split, limit in limits.items() if limit}})
    model = lmlab.from_pretrained("minilm")
    tokenizer = lmlab.Tokenizer.from_pretrained("minilm")
    rows = run_strategies(task, model, tokenizer, strategies, seeds, runs, args.precision)
    metric = task.metrics[0]
    summary = summarize(rows, metric)
    print(f"\n{args.task} ({task.sizes()}), MiniLM frozen, seeds {args.seeds}, {describe_host()}")
    print(render(summary, metric))
    result = {"task": args.task, "metric": metric, "sizes": task.sizes(), "seeds": list(seeds),
              "host": describe_host(), "rows": rows, "summary": summary}
    if args.out:
        atomic_write_json(args.out, result)
    return result


if __name__ == "__main__":
    try:
        main()
    except LmlabError as error:
        sys.exit(f"error: {error}")
