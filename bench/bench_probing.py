"""Probing's feature extraction against plain inference on the same texts.

Plain: tokenize each batch and run ``model(..., output_hidden_states=True)`` (what any layer-wise
analysis must at least do). Ours: :func:`lmlab.analysis.layer_cache.extract_word_features` on
the same texts in the same batches (sorted by length, as extraction does): tokenizing with
character offsets, the same forward, pooling every requested word in every layer, and writing
the rows into a ``.npy`` memory map. The two alternate (A B A B ...) for ``--reps`` repetitions;
the script prints the median wall seconds of each (with the other processes' CPU use during
each repetition: interference), the ratio ours / plain (the aim: at most 1.10), the same for
process CPU seconds (steadier on a shared host) and the host.

    .venv/bin/python bench/bench_probing.py --tasks pos,ner,supersense --max-examples 1000 --reps 5
    .venv/bin/python bench/bench_probing.py --max-examples 50 --reps 1  # smoke
    .venv/bin/python bench/bench_probing.py --threads 1  # a busy host: no thread spinning
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import alternate, print_json  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--tasks", default="pos,ner,supersense")
    parser.add_argument("--max-examples", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int,
                        help="torch threads (default: torch's); 1 avoids the idle-thread spinning "
                             "that inflates small ops on a busy shared host")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from lmlab.analysis.layer_cache import extract_word_features
    from lmlab.analysis.probing import word_requests
    from lmlab.load import load_model_and_tokenizer
    from lmlab.models.inputs import input_limit, model_inputs
    from lmlab.tasks.probing import load_probing_task
    from lmlab.utils.host import describe_host

    model, tokenizer = load_model_and_tokenizer(args.model)
    tasks = [load_probing_task(name, args.max_examples) for name in args.tasks.split(",")]
    requests, _ = word_requests(tasks)
    max_length = input_limit(model, tokenizer)
    texts = sorted((r.text for r in requests), key=len)  # extraction's batch order
    batches = [texts[i:i + args.batch_size] for i in range(0, len(texts), args.batch_size)]
    rows = sum(len(r.spans) for r in requests)
    shape = (rows, model.config.num_hidden_layers + 1, model.config.hidden_size)
    folder = Path(tempfile.mkdtemp(prefix="bench-probing-"))

    cpu: dict[str, list[float]] = {"plain": [], "ours": []}

    @torch.inference_mode()
    def plain() -> float:
        start, cpu_start = time.perf_counter(), time.process_time()
        for chunk in batches:
            batch = tokenizer(chunk, padding=True, truncation=True, max_length=max_length,
                              return_tensors="pt")
            model(**model_inputs(model, batch), output_hidden_states=True, heads=[])
        cpu["plain"].append(time.process_time() - cpu_start)
        return time.perf_counter() - start

    def ours() -> float:
        start, cpu_start = time.perf_counter(), time.process_time()
        out = np.lib.format.open_memmap(folder / "features.npy", mode="w+", dtype=np.float32,
                                        shape=shape)
        extract_word_features(model, tokenizer, requests, out, args.batch_size, max_length)
        out.flush()
        del out
        cpu["ours"].append(time.process_time() - cpu_start)
        return time.perf_counter() - start

    plain()  # warm-up: first-call allocations and kernel selection
    cpu["plain"].clear()
    results = alternate({"plain": plain, "ours": ours}, args.reps)
    cpu_median = {name: statistics.median(values) for name, values in cpu.items()}
    report = {"host": describe_host(), "model": args.model, "tasks": args.tasks,
              "texts": len(texts), "words": rows, "batch_size": args.batch_size,
              "plain_s": results["plain"], "ours_s": results["ours"],
              "ratio_ours_over_plain": results["ours"]["median"] / results["plain"]["median"],
              "cpu_s_median": cpu_median,
              "cpu_ratio_ours_over_plain": cpu_median["ours"] / cpu_median["plain"]}
    print_json(report)
    return report


if __name__ == "__main__":
    main()
