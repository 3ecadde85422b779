"""Activation checkpointing (the Trainer's ``activation_checkpointing`` speed setting): the peak
memory and the step time of a forward + backward of a small BERT at 2,048 tokens, with and
without it.

Each measurement runs in a fresh child process per side, the sides alternating (off, on, off,
on, ...) for ``--reps`` rounds: the model is built and runs one warm-up step, the high-water
mark of its resident memory (``VmHWM``) is reset, then ``--steps`` training steps run (forward,
masked-LM loss on 15% of the positions, backward); the child reports the peak resident memory
those steps added to the loaded model (activations and gradients; tracemalloc does not see
torch's allocations) and their median time. It also counts the bytes the autograd graph keeps
for the backward pass of one forward (``saved_tensors_hooks``): a figure that does not depend
on the allocator or the host. Medians over the rounds are printed as JSON and a Markdown
table, with the host. On a shared machine the figures need a quiet run.

    OMP_NUM_THREADS=2 python bench/bench_activation_checkpointing.py --reps 5 --steps 3
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

from bench._common import cpu_model, other_cpu_seconds, rss_kib  # noqa: E402

SIDES = ("off", "on")
# glibc hands a freed block of 128 KiB or more back to the system (a fixed threshold: by
# default it rises as large blocks are freed, and freed activations would stay resident), so
# the resident set after the warm-up step is the loaded model's and the peak is the steps'
CHILD_ENV = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}



def build(size: str, seq_len: int, on: bool):
    """A BERT of ``size`` whose positions reach ``seq_len``, its stack set to checkpoint."""
    import torch

    from lmlab.models.model import LanguageModel
    from lmlab.models.presets import preset

    torch.manual_seed(0)
    config = preset("bert", size, max_position_embeddings=max(seq_len, 512))
    model = LanguageModel(config, heads=("mlm",)).train()
    model.transformer.checkpoint_layers = on
    return model


def step_fn(model, batch_size: int, seq_len: int):
    """One training step's forward and backward: the masked-LM loss on 15% of the positions
    (the head runs on those only, as lmlab's MLM objective does)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, model.config.vocab_size, (batch_size, seq_len), generator=generator)
    mask = torch.ones_like(ids)
    chosen = torch.rand(batch_size, seq_len, generator=generator) < 0.15

    def step() -> None:
        model.zero_grad(set_to_none=True)
        hidden = model(input_ids=ids, attention_mask=mask, heads=[]).last_hidden_state
        logits = model.heads["mlm"](hidden[chosen])  # (N, V): the chosen positions only
        torch.nn.functional.cross_entropy(logits, ids[chosen]).backward()

    return step


def saved_mib(model, step) -> float:
    """MiB of activations the autograd graph keeps for the backward pass of one step's forward
    (each storage once; the weights, which linear layers also save, not counted)."""
    import torch

    seen = {p.untyped_storage().data_ptr() for p in model.parameters()}
    total = 0

    def pack(tensor):
        nonlocal total
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return total / 2**20


def child(side: str, args: argparse.Namespace) -> None:
    """One side's figures, as one JSON line."""
    import gc

    model = build(args.size, args.seq_len, side == "on")
    step = step_fn(model, args.batch, args.seq_len)
    step()  # warm-up: one-time costs (thread pools, kernels' buffers), not timed or counted
    gc.collect()
    loaded = rss_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")  # reset the high-water mark (Linux >= 4.0)
    times = []
    for _ in range(args.steps):  # the peak of these steps: activations, gradients, the loss
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    peak = (rss_kib("VmHWM") - loaded) / 1024
    print(json.dumps({"peak_added_mib": peak, "step_s": statistics.median(times),
                      "saved_mib": saved_mib(model, step)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="mini", help="BERT preset (default mini: 4 x 256)")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--reps", type=int, default=5, help="rounds of (off, on)")
    parser.add_argument("--steps", type=int, default=3,
                        help="measured steps per child (after one warm-up step)")
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args)

    import torch

    from lmlab.utils.host import describe_host

    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    for _ in range(args.reps):
        for side in SIDES:
            before = other_cpu_seconds()
            started = time.perf_counter()
            done = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--child", side],
                                  capture_output=True, text=True, check=True, env=CHILD_ENV)
            figures = json.loads(done.stdout.strip().splitlines()[-1])
            figures["interference"] = round((other_cpu_seconds() - before)
                                            / (time.perf_counter() - started), 2)
            runs[side].append(figures)
    rows = {side: {key: statistics.median(r[key] for r in runs[side])
                   for key in ("peak_added_mib", "step_s", "saved_mib")} for side in SIDES}
    ratios = {key: rows["on"][key] / rows["off"][key] for key in rows["off"]}
    report = {"host": describe_host(), "cpu": cpu_model(), "threads": torch.get_num_threads(),
              "load": os.getloadavg(), "model": f"bert-{args.size}", "tokens":
              f"{args.batch} x {args.seq_len}", "reps": args.reps, "steps": args.steps,
              "rows": rows, "on_vs_off": ratios, "runs": runs}
    print(json.dumps(report, indent=2))
    print("\n| activation checkpointing | peak memory added (MiB) | kept for backward (MiB) "
          "| step (s) |\n|---|---:|---:|---:|")
    for side in SIDES:
        row = rows[side]
        print(f"| {side} | {row['peak_added_mib']:.0f} | {row['saved_mib']:.0f} | "
              f"{row['step_s']:.2f} |")
    print(f"| on / off | {ratios['peak_added_mib']:.2f} | {ratios['saved_mib']:.2f} | "
          f"{ratios['step_s']:.2f} |")


if __name__ == "__main__":
    main()
