"""Could oneDNN's fp32 kernels speed up training's linear layers? Each product of a training
step, timed on torch's default fp32 path (MKL on x86) and on oneDNN's ``mkldnn_linear``:
with the tensors already in oneDNN's layout (what the kernel can do) and converted on every call
(what an eager training step would pay: inputs, weights and gradients are ordinary tensors), with
bf16 beside them. Paths alternate per shape; medians; GFLOP/s at 2 FLOPs per multiply-add.

    python bench/bench_onednn_linear.py --reps 5
"""

from __future__ import annotations

import argparse
import time

import torch
from _common import alternate, environment, print_json

SHAPES = [(2048, 384, 384), (2048, 384, 1536), (2048, 1536, 384),  # MiniLM, 16 x 128 tokens
          (4096, 256, 1024), (4096, 256, 8192)]  # bert-mini, 32 x 128; its vocabulary head


def paths(m: int, k: int, n: int) -> dict[str, tuple[float, object]]:
    """name -> (FLOPs, callable) for the forward product and both gradients of one layer."""
    linear = torch._C._nn.mkldnn_linear
    x, w, g = torch.randn(m, k), torch.randn(n, k), torch.randn(m, n)
    wt, xt = w.t().contiguous(), x.t().contiguous()
    x_d, w_d = x.to_mkldnn(), w.to_mkldnn()
    flops = 2.0 * m * k * n
    return {
        "forward mkl": (flops, lambda: torch.nn.functional.linear(x, w)),
        "forward onednn, in its layout": (flops, lambda: linear(x_d, w_d, None)),
        "forward onednn, converted": (flops, lambda: linear(x.to_mkldnn(), w.to_mkldnn(),
                                                            None).to_dense()),
        "forward bf16": (flops, lambda: torch.nn.functional.linear(x.bfloat16(), w.bfloat16())),
        "input grad mkl": (flops, lambda: g @ w),
        "input grad onednn, converted": (flops, lambda: linear(g.to_mkldnn(), wt.to_mkldnn(),
                                                               None).to_dense()),
        "weight grad mkl": (flops, lambda: g.t() @ x),
        "weight grad onednn, converted": (flops, lambda: linear(
            g.t().contiguous().to_mkldnn(), xt.to_mkldnn(), None).to_dense()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    rows = []
    with torch.no_grad():
        for shape in SHAPES:
            runs = paths(*shape)

            def rate(flops: float, fn) -> object:
                def once() -> float:  # GFLOP/s of one call
                    start = time.perf_counter()
                    fn()
                    return flops / (time.perf_counter() - start) / 1e9
                return once

            for _, fn in runs.values():
                fn()  # warm-up: kernel selection, weight reordering
            results = alternate({name: rate(*run) for name, run in runs.items()}, args.reps)
            rows.append({"shape (tokens, in, out)": list(shape),
                         **{name: round(results[name]["median"]) for name in runs},
                         "max interference (other cores busy)": max(
                             max(r["interference_s"]) for r in results.values())})
    print_json({"environment": environment(), "GFLOP/s": rows})


if __name__ == "__main__":
    main()
