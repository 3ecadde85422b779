"""Sliding-window attention (``attention_window``) and BigBird's block-sparse attention
(``block_sparse``) against dense attention: the peak memory of a forward + backward of a small
bidirectional model at 2,048, 4,096 and 8,192 tokens, and the growth per doubling of the length
(issue #31 asks <= 2.2x for the linear patterns).

Each (side, length) runs in a fresh child process, sides alternating per length: the model is
built and runs one warm-up step, the resident high-water mark (``VmHWM``) is reset, then
``--steps`` training steps run (masked-LM loss on every position, backward); the child reports
the peak resident memory those steps added to the loaded model and their median time. Timings
need a quiet machine; memory figures do not.

    OMP_NUM_THREADS=2 python bench/bench_long_attention.py --steps 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import cpu_model, rss_kib  # noqa: E402

SIDES = ("local", "bigbird", "dense")
CHILD_ENV = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}  # freed blocks go back (see
# bench_activation_checkpointing.py): the peak is the steps', not a previous step's leftovers



def child(side: str, length: int, args: argparse.Namespace) -> None:
    """One side's figures at ``length`` tokens, as one JSON line."""
    import gc

    import torch

    from lmlab.models.config import TransformerConfig
    from lmlab.models.model import LanguageModel

    torch.manual_seed(0)
    config = TransformerConfig(
        vocab_size=1000, hidden_size=args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, intermediate_size=4 * args.hidden,
        max_position_embeddings=length, attention_window=args.window if side == "local" else None,
        block_sparse={"block_size": args.block, "num_random_blocks": args.random}
        if side == "bigbird" else None)
    model = LanguageModel(config, heads=("mlm",)).train()
    ids = torch.randint(5, 1000, (1, length), generator=torch.Generator().manual_seed(0))
    glob = torch.zeros_like(ids)
    glob[:, 0] = 1  # [CLS] global, as Longformer's classification inputs

    def step() -> None:
        model.zero_grad(set_to_none=True)
        extra = {"global_attention_mask": glob} if side == "local" else {}
        logits = model(input_ids=ids, **extra).logits
        torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), ids.view(-1)).backward()

    step()  # warm-up
    gc.collect()
    loaded = rss_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")  # reset the high-water mark (Linux >= 4.0)
    times = []
    for _ in range(args.steps):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    print(json.dumps({"peak_added_mib": (rss_kib("VmHWM") - loaded) / 1024,
                      "step_s": statistics.median(times)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="2048,4096,8192")
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--block", type=int, default=64, help="BigBird's block_size")
    parser.add_argument("--random", type=int, default=3, help="BigBird's num_random_blocks")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--sides", default=",".join(SIDES), help="which of " + ", ".join(SIDES))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    if args.child:
        side, length = args.child.split(":")
        return child(side, int(length), args)

    from lmlab.utils.host import describe_host

    sides = [side for side in SIDES if side in args.sides.split(",")]
    rows: dict[str, dict[int, dict]] = {side: {} for side in sides}
    for length in lengths:
        for side in sides:
            done = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--child",
                                   f"{side}:{length}"], capture_output=True, text=True,
                                  check=True, env=CHILD_ENV)
            rows[side][length] = json.loads(done.stdout.strip().splitlines()[-1])
    report = {"host": describe_host(), "cpu": cpu_model(), "load": os.getloadavg(),
              "model": f"{args.layers} x {args.hidden}, {args.heads} heads, window {args.window}, "
                       f"blocks of {args.block} with {args.random} random",
              "rows": rows}
    print(json.dumps(report, indent=2))
    print("\n| tokens | " + " | ".join(f"{side} peak (MiB) | x per doubling" for side in sides)
          + " | " + " | ".join(f"{side} step (s)" for side in sides) + " |\n|---:|"
          + "---:|" * (3 * len(sides)))
    for i, length in enumerate(lengths):
        cells = [f"{length:,}"]
        for side in sides:
            peak = rows[side][length]["peak_added_mib"]
            growth = peak / rows[side][lengths[i - 1]]["peak_added_mib"] if i else None
            cells += [f"{peak:.0f}", f"{growth:.2f}" if growth else "-"]
        cells += [f"{rows[side][length]['step_s']:.2f}" for side in sides]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
