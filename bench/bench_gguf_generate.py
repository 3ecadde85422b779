"""Greedy generation from one GGUF file: lmlab (weights kept in their blocks) against llama.cpp
(llama-cpp-python, the optional ``llamacpp`` extra), batch 1 and 8, the same threads.

Each measurement is a fresh process per side, the sides alternating (lmlab, llama.cpp, lmlab,
...), so both see the same machine load; medians of ``--reps``. A process imports its library,
then times ``load`` (lmlab: ``load_gguf_model``, kernels included; llama.cpp: model and context),
one warm-up generation, then the timed one: the same prompt token ids (SmolLM2's tokenizer)
repeated ``batch`` times, ``--tokens`` greedy tokens each, the end-of-text token ignored.
tokens/s counts new tokens of all rows over the whole call (prompt included); tokens per CPU
second divides by the process's CPU time instead (on a shared host, with ``--threads 1``, the
figure that load disturbs least). ``peak_mib`` is
the process's peak resident memory (VmHWM: libraries, weights, caches). llama.cpp's batch of 8
is 8 sequences in one ``llama_decode`` per step (its low-level API, as llama-server does); lmlab's
is one ``generate`` call on a (8, T) batch. ``--dequantize`` adds lmlab's float32 reference path.

Run (quiet machine):  .venv/bin/python bench/bench_gguf_generate.py --reps 5 --dequantize
Shared machine:       .venv/bin/python bench/bench_gguf_generate.py --reps 3 --threads 1
Small check:          .venv/bin/python bench/bench_gguf_generate.py --reps 1 --tokens 8
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import cpu_model, peak_rss_mib  # noqa: E402

PROMPT = "The capital of France is"


def prompt_ids(path: str) -> list[int]:
    from lmlab.tokenization.tokenizer import Tokenizer

    return Tokenizer.from_pretrained(path).encode(PROMPT)


def run_lmlab(path: str, ids: list[int], batch: int, tokens: int, threads: int,
              dequantize: bool, parallel_work: int | None) -> dict:
    import torch

    from lmlab.generation.generate import generate
    from lmlab.interop.gguf import load_gguf_model
    from lmlab.models import quantised

    torch.set_num_threads(threads)
    if parallel_work is not None:
        quantised.PARALLEL_WORK = parallel_work
    start = time.perf_counter()
    model = load_gguf_model(path, dequantize=dequantize)
    load = time.perf_counter() - start
    prompt = torch.tensor([ids] * batch)

    def once(count: int) -> tuple[float, float, list[int]]:
        start, cpu = time.perf_counter(), time.process_time()
        out = generate(model, prompt, max_new_tokens=count, eos_token_id=None)
        return (time.perf_counter() - start, time.process_time() - cpu,
                out[0, len(ids):].tolist())

    once(4)
    return result(load, batch, tokens, *once(tokens))


def result(load: float, batch: int, tokens: int, seconds: float, cpu: float,
           first: list[int]) -> dict:
    """One side's figures: tokens/s over the wall clock and per CPU second of the process (the
    latter holds up on a shared host when the side runs on one thread)."""
    return {"load_s": load, "tokens_per_s": batch * tokens / seconds,
            "tokens_per_cpu_s": batch * tokens / cpu, "first_row": first}


def run_llama_cpp(path: str, ids: list[int], batch: int, tokens: int, threads: int) -> dict:
    import llama_cpp as L
    import numpy as np

    L.llama_backend_init()  # its log goes to stderr, which the parent drops
    start = time.perf_counter()
    model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
    params = L.llama_context_default_params()
    params.n_ctx = batch * (len(ids) + tokens + 16)
    params.n_batch = params.n_ubatch = max(512, batch * len(ids))
    params.n_seq_max, params.kv_unified = batch, True
    params.n_threads = params.n_threads_batch = threads
    ctx = L.llama_init_from_model(model, params)
    load = time.perf_counter() - start
    vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    native = L.llama_batch_init(params.n_batch, 0, batch)

    def decode(rows: list[list[int]], first_pos: int) -> list[int]:
        """Feed each sequence's tokens from position ``first_pos``; the argmax of each last."""
        native.n_tokens = 0
        for seq, row in enumerate(rows):
            for offset, token in enumerate(row):
                i = native.n_tokens
                native.token[i], native.pos[i] = token, first_pos + offset
                native.n_seq_id[i], native.seq_id[i][0] = 1, seq
                native.logits[i] = offset == len(row) - 1
                native.n_tokens += 1
        if L.llama_decode(ctx, native) != 0:
            raise RuntimeError("llama_decode failed")
        picks, i = [], -1
        for row in rows:
            i += len(row)
            logits = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(vocab,))
            picks.append(int(logits.argmax()))
        return picks

    def once(count: int) -> tuple[float, float, list[int]]:
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        start, cpu = time.perf_counter(), time.process_time()
        picks = decode([ids] * batch, 0)
        first = [picks[0]]
        for step in range(1, count):
            picks = decode([[p] for p in picks], len(ids) + step - 1)
            first.append(picks[0])
        return time.perf_counter() - start, time.process_time() - cpu, first

    once(4)
    return result(load, batch, tokens, *once(tokens))


def child(args: argparse.Namespace) -> None:
    """One side, one batch size, in this (fresh) process; prints one JSON line."""
    if args.side == "llama.cpp":
        result = run_llama_cpp(args.path, args.ids, args.batch, args.tokens, args.threads)
    else:
        result = run_lmlab(args.path, args.ids, args.batch, args.tokens, args.threads,
                           args.side == "lmlab-fp32", args.parallel_work)
    result["peak_mib"] = peak_rss_mib()
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gguf", help="the GGUF file (default: SmolLM2-135M-Instruct Q4_1)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--sides", default="lmlab,llama.cpp")
    parser.add_argument("--dequantize", action="store_true",
                        help="also lmlab's float32 reference path")
    parser.add_argument("--parallel-work", type=int, help="lmlab's quantised.PARALLEL_WORK: the "
                        "multiply-adds from which a product runs on every thread")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(argparse.Namespace(**json.loads(args.child)))
        return
    from lmlab.utils.catalog import smollm2_gguf

    path = str(args.gguf or smollm2_gguf())
    ids = prompt_ids(path)
    sides = args.sides.split(",") + (["lmlab-fp32"] if args.dequantize else [])
    if "llama.cpp" in sides and importlib.util.find_spec("llama_cpp") is None:
        sys.exit("llama-cpp-python is not installed: pip install -e '.[llamacpp]' (builds "
                 "llama.cpp from source), or --sides lmlab")
    env = dict(os.environ, LMLAB_NO_PROGRESS="1", OMP_NUM_THREADS=str(args.threads))
    report = {"host": cpu_model(), "cores": os.cpu_count(), "threads": args.threads,
              "parallel_work": args.parallel_work,
              "file": os.path.basename(path), "tokens": args.tokens, "reps": args.reps,
              "prompt_tokens": len(ids), "batches": {}}
    for batch in (int(b) for b in args.batches.split(",")):
        runs: dict[str, list[dict]] = {side: [] for side in sides}
        for _ in range(args.reps):
            for side in sides:
                spec = dict(side=side, path=path, ids=ids, batch=batch, tokens=args.tokens,
                            threads=args.threads, parallel_work=args.parallel_work)
                out = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)],
                                     env=env, check=True, capture_output=True, text=True).stdout
                runs[side].append(json.loads(out.splitlines()[-1]))
                print(batch, side, {k: round(v, 2) for k, v in runs[side][-1].items()
                                    if k != "first_row"}, flush=True)
        summary = {side: {key: round(statistics.median(r[key] for r in values), 2)
                          for key in ("tokens_per_s", "tokens_per_cpu_s", "load_s", "peak_mib")}
                   for side, values in runs.items()}
        if "lmlab" in summary and "llama.cpp" in summary:
            ours, theirs = summary["lmlab"], summary["llama.cpp"]
            for key in ("tokens_per_s", "tokens_per_cpu_s"):
                summary[f"ratio_{key}"] = round(ours[key] / theirs[key], 2)
            summary["ratio_peak_mib"] = round(ours["peak_mib"] / theirs["peak_mib"], 2)
        first = {side: values[0]["first_row"] for side, values in runs.items()}
        summary["same_greedy_tokens"] = len(set(map(tuple, first.values()))) == 1
        report["batches"][batch] = summary
    report["load_average"] = os.getloadavg()[0]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
