"""Where the peak memory of generating from a GGUF file goes (lmlab, weights kept in their
blocks): one fresh process walks the stages a user's process goes through and records its
resident memory (``VmRSS``) and peak (``VmHWM``) after each, plus what the model holds
(codes, scales and minima of the block-quantised layers; float32 parameters) and the KV cache
the generation needs (float32 keys and values). Compare with bench_gguf_generate.py's
``peak_mib`` for llama.cpp's whole process.

Run:  .venv/bin/python bench/bench_gguf_memory.py [--tokens 64] [--batch 8]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import cpu_model, rss_kib  # noqa: E402

STAGES: list[dict] = []


def mark(stage: str) -> None:
    """Record the resident memory and peak so far after ``stage``, in MiB."""
    rss, peak = rss_kib("VmRSS") / 1024, rss_kib("VmHWM") / 1024
    grown = peak - (STAGES[-1]["peak_mib"] if STAGES else 0.0)
    STAGES.append({"stage": stage, "rss_mib": round(rss, 1), "peak_mib": round(peak, 1),
                   "peak_grew_mib": round(grown, 1)})
    print(f"{stage:44s} resident {rss:7.1f}  peak {peak:7.1f}  (+{grown:.1f}) MiB", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gguf", help="the GGUF file (default: SmolLM2-135M-Instruct Q4_1)")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("LMLAB_NO_PROGRESS", "1")
    mark("interpreter, json, bench helpers")
    import numpy as np

    mark("numpy")
    import torch

    torch.set_num_threads(args.threads)
    mark("torch")
    from lmlab.generation.generate import generate
    from lmlab.interop.gguf import load_gguf_model
    from lmlab.utils.catalog import smollm2_gguf

    mark("lmlab's modules (generation, GGUF reader)")
    import numba  # noqa: F401

    mark("numba + llvmlite imported")
    from lmlab.models.quantised import BlockQuantLinear, load_kernels

    load_kernels()
    mark("kernels read from numba's cache")
    path = str(args.gguf or smollm2_gguf())
    model = load_gguf_model(path)
    mark("model loaded (peak - resident = transient copies)")
    blocks = sum(m.nbytes for m in model.modules() if isinstance(m, BlockQuantLinear))
    floats = sum(p.numel() * p.element_size() for p in model.parameters())
    ids = torch.tensor([[504, 3575, 282, 4649, 314]])  # "The capital of France is"
    generate(model, ids, max_new_tokens=args.tokens, eos_token_id=None)
    mark(f"generated batch 1, {args.tokens} tokens")
    generate(model, ids.repeat(args.batch, 1), max_new_tokens=args.tokens, eos_token_id=None)
    mark(f"generated batch {args.batch}, {args.tokens} tokens")
    c = model.config
    kv = (2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim
          * (ids.shape[1] + args.tokens) * 4)  # bytes per row of the batch
    report = {"host": cpu_model(), "file": os.path.basename(path),
              "file_mib": round(os.path.getsize(path) / 2 ** 20, 1),
              "block_layers_mib": round(blocks / 2 ** 20, 1),
              "float32_parameters_mib": round(floats / 2 ** 20, 1),
              "kv_cache_mib": {1: round(kv / 2 ** 20, 1),
                               args.batch: round(args.batch * kv / 2 ** 20, 1)},
              "numpy": np.__version__, "torch": torch.__version__, "stages": STAGES}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
