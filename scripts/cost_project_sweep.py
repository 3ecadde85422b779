"""What a small project cost against its final run (Strubell et al. 2019's "with tuning"), on
real runs: a learning-rate sweep of a tiny BERT (MLM on KJV chapters, three rates x two
seeds), then the final run at the sweep's best rate, trained in two sessions (it is resumed
to twice the sweep's steps), then ``lmlab cost project`` over the folder.

    python scripts/cost_project_sweep.py                           # docs/cost.md
    python scripts/cost_project_sweep.py --steps 4 --out /tmp/p --plot /tmp/p/cost.png

Prints the project's Markdown table and writes its plot (``--plot``).
A rerun resumes or reuses the finished runs under OUT.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import lmlab
from lmlab.data.build import build_corpus
from lmlab.data.shards import build_shards
from lmlab.training.project import project_cost
from lmlab.utils.host import describe_host

RATES = (1e-4, 5e-4, 2e-3)
SEEDS = (0, 1)


def pretrain(out: Path, shards: Path, lr: float, seed: int, steps: int) -> float:
    """A tiny BERT's MLM run; its last validation loss."""
    config = lmlab.PretrainConfig.from_sections(
        out=str(out), family="bert", size="tiny", objective="mlm", shards=str(shards),
        seq_len=64, batch_size=8, lr=lr, warmup=0.1, max_steps=steps, seed=seed,
        eval_batches=4, eval_every=steps, precision="fp32", threads=2)
    return lmlab.pretrain(config).last_eval["eval_loss"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/cost-project", help="the project's folder")
    parser.add_argument("--steps", type=int, default=40, help="steps of each sweep run")
    parser.add_argument("--plot", default="docs/cost-project.png")
    parser.add_argument("--price-per-hour", type=float, default=None)
    args = parser.parse_args()
    out = Path(args.out)
    data = out.parent / f"{out.name}-data"
    if not (data / "shards" / "manifest.json").is_file():
        build_corpus(["kjv"], data / "corpus", max_documents=300, validation_fraction=0.05,
                     exclude_tasks=(), overwrite=True)
        build_shards(lmlab.Tokenizer.from_pretrained("minilm"), data / "corpus",
                     data / "shards", show_progress=False, overwrite=True)
    losses = {(lr, seed): pretrain(out / "sweep" / f"lr{lr:g}-seed{seed}", data / "shards", lr,
                                   seed, args.steps)
              for lr in RATES for seed in SEEDS}
    best = min(RATES, key=lambda lr: sum(losses[lr, s] for s in SEEDS))
    pretrain(out / "final", data / "shards", best, 0, args.steps)  # session 1
    pretrain(out / "final", data / "shards", best, 0, 2 * args.steps)  # resumed: session 2
    project = project_cost(out, final=out / "final", price_per_hour=args.price_per_hour)
    plot = project.plot(args.plot)
    print(f"host: {describe_host()}; sweep losses: "
          + ", ".join(f"lr {lr:g} seed {s}: {v:.3f}" for (lr, s), v in losses.items())
          + f"; best lr {best:g}")
    print(project.to_markdown())
    print(f"plot: {plot}")


if __name__ == "__main__":
    main()
