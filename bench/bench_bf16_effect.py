"""The effect of bf16 autocast on a trained model's validation MLM loss.

Precision is a speed setting in lmlab (``--precision`` sits under ``speed:``), but bf16 changes
the numbers. This script measures by how much, on the quantity the pretraining runs report:
the validation MLM loss on the fixed-mask batches (``validation_batches``, seed 1234) of a
trained checkpoint, evaluated in fp32 and under bf16 autocast (weights stay fp32), same
batches, same masks.

    GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736 \\
        .venv/bin/python bench/bench_bf16_effect.py --model runs/NAME/model \\
        --shards 'runs/demo/stages/shards-*/shards' --batches 2

On a CPU without bf16 instructions bf16 is emulated (5-60x slower than fp32): keep ``--batches`` small.
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
import time
from pathlib import Path

import torch


def validation_loss(model, objective, batches, precision: str) -> float:
    """Mean over batches of the objective's loss, under ``precision``."""
    model.eval()
    total = 0.0
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16,
                                         enabled=precision == "bf16"):
        for batch in batches:
            total += float(objective.compute_loss(model, batch).loss)
    return total / len(batches)


def main() -> int:
    from lmlab.cost.precision import cpu_has_native_bf16
    from lmlab.data.pretraining import validation_batches
    from lmlab.load import from_pretrained
    from lmlab.objectives.registry import build_objective
    from lmlab.objectives.special_tokens import SpecialTokens
    from lmlab.training.pretrain import find_tokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a trained model folder (RUN/model)")
    parser.add_argument("--shards", required=True, help="token-shard folder or glob")
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args()
    shards = sorted(glob.glob(args.shards))[-1] if glob.has_magic(args.shards) else args.shards
    tokenizer, _ = find_tokenizer(Path(shards), None)
    objective = build_objective("mlm", SpecialTokens.from_tokenizer(tokenizer))
    model = from_pretrained(args.model)
    batches = validation_batches(shards, objective=objective, batch_size=args.batch_size,
                                 seq_len=args.seq_len, seed=1234, max_batches=args.batches)
    result = {"model": args.model, "batches": len(batches),
              "native_bf16": cpu_has_native_bf16(), "threads": torch.get_num_threads()}
    for precision in ("fp32", "bf16"):
        started = time.perf_counter()
        result[f"{precision}_loss"] = validation_loss(model, objective, batches, precision)
        result[f"{precision}_seconds"] = round(time.perf_counter() - started, 2)
    result["bf16_minus_fp32"] = result["bf16_loss"] - result["fp32_loss"]
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
