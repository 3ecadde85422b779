"""Encoder-decoder benchmarks: lmlab vs transformers, side by side in one process, A B A B.

1. Training throughput (source + target tokens per second): T5-small-shaped (6 + 6 layers,
   512 wide, 8 heads of 64, ReLU FFN 2048, vocabulary 32,128) and BART-base-shaped (6 + 6
   layers, 768 wide, 12 heads, FFN 3072, vocabulary 50,265) models with random weights, the
   same batches (sources 128 tokens, targets 64, batch ``--batch``), one AdamW step per batch,
   dropout off; ours fp32 vs theirs fp32, and ours under bf16 autocast vs theirs fp32 where the
   host has native bf16.
2. Generation with the key/value cache (self- and cross-attention), greedy, ``--new-tokens``
   forced new tokens, batch 1 and 8, T5-small-shaped random weights (the same weights on both
   sides: ours loaded from transformers' folder), fp32.

Medians of ``--reps`` alternated repetitions; the ratio is ours / reference (> 1: ours faster).
Run:  .venv/bin/python bench/bench_seq2seq.py --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import environment  # noqa: E402
from bench_decoders import _median_pair  # noqa: E402  (A B A B, medians)


def _hf_configs():
    import transformers

    t5 = transformers.T5Config(d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8,
                               vocab_size=32128, dropout_rate=0.0, decoder_start_token_id=0)
    bart = transformers.BartConfig(d_model=768, encoder_layers=6, decoder_layers=6,
                                   encoder_attention_heads=12, decoder_attention_heads=12,
                                   encoder_ffn_dim=3072, decoder_ffn_dim=3072, vocab_size=50265,
                                   dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    return {"t5-small": (transformers.T5ForConditionalGeneration, t5),
            "bart-base": (transformers.BartForConditionalGeneration, bart)}


def _pair_of_models(name: str):
    """transformers' model with random weights and ours loaded from its folder."""
    import lmlab

    cls, config = _hf_configs()[name]
    torch.manual_seed(0)
    theirs = cls(config)
    with tempfile.TemporaryDirectory() as folder:
        theirs.save_pretrained(folder)
        ours = lmlab.from_pretrained(folder)
    return ours, theirs, config.vocab_size


def training(reps: int, steps: int, batch: int, with_bf16: bool) -> list[dict]:
    return [row for name in ("t5-small", "bart-base")
            for row in _training_rows(name, reps, steps, batch, with_bf16)]


def _training_rows(name: str, reps: int, steps: int, batch: int, with_bf16: bool) -> list[dict]:
    rows = []
    ours, theirs, vocab = _pair_of_models(name)
    ours.train()
    theirs.train()
    generator = torch.Generator().manual_seed(1)
    src = torch.randint(4, vocab, (batch, 128), generator=generator)
    tgt = torch.randint(4, vocab, (batch, 64), generator=generator)
    mask = torch.ones_like(src)
    opt_a = torch.optim.AdamW(ours.parameters(), lr=1e-5)
    opt_b = torch.optim.AdamW(theirs.parameters(), lr=1e-5)

    def step_ours(bf16: bool) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = ours(input_ids=src, attention_mask=mask, labels=tgt).loss
        loss.backward()
        opt_a.step()
        opt_a.zero_grad(set_to_none=True)

    def step_theirs() -> None:
        loss = theirs(input_ids=src, attention_mask=mask, labels=tgt).loss
        loss.backward()
        opt_b.step()
        opt_b.zero_grad(set_to_none=True)

    def timed(fn):
        def run() -> float:
            fn()  # warm-up step
            start = time.perf_counter()
            for _ in range(steps):
                fn()
            return steps * batch * (128 + 64) / (time.perf_counter() - start)
        return run

    settings = [("fp32 vs fp32", False)] + ([("ours bf16 vs theirs fp32", True)]
                                            if with_bf16 else [])
    for label, bf16 in settings:
        a, b = _median_pair(timed(lambda bf16=bf16: step_ours(bf16)), timed(step_theirs),
                            reps)
        rows.append({"bench": f"train {name} {batch}x(128+64)", "setting": label,
                     "ours_tok_s": round(a), "ref_tok_s": round(b), "ratio": round(a / b, 2)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def generation(reps: int, new_tokens: int, batches: list[int]) -> list[dict]:
    from lmlab.generation.generate import generate

    ours, theirs, vocab = _pair_of_models("t5-small")
    ours.eval()
    theirs.eval()
    rows = []
    for batch in batches:
        src = torch.randint(4, vocab, (batch, 64), generator=torch.Generator().manual_seed(2))
        mask = torch.ones_like(src)

        def run_ours(src=src, mask=mask, batch=batch) -> float:
            start = time.perf_counter()
            out = generate(ours, src, mask, max_new_tokens=new_tokens,
                           min_new_tokens=new_tokens)
            assert out.shape[1] == 1 + new_tokens
            return batch * new_tokens / (time.perf_counter() - start)

        def run_theirs(src=src, mask=mask, batch=batch) -> float:
            start = time.perf_counter()
            with torch.no_grad():
                out = theirs.generate(input_ids=src, attention_mask=mask,
                                      max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                      do_sample=False)
            assert out.shape[1] == 1 + new_tokens
            return batch * new_tokens / (time.perf_counter() - start)

        run_ours()
        run_theirs()  # warm-up
        a, b = _median_pair(run_ours, run_theirs, reps)
        rows.append({"bench": f"generate t5-small batch {batch}", "setting": "fp32, cache",
                     "ours_tok_s": round(a, 1), "ref_tok_s": round(b, 1),
                     "ratio": round(a / b, 2)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3, help="training steps per repetition")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--only", choices=["train", "generate"])
    args = parser.parse_args()
    from lmlab.cost.precision import cpu_has_native_bf16

    print(json.dumps({"environment": environment()}), flush=True)
    rows = []
    if args.only in (None, "train"):
        rows += training(args.reps, args.steps, args.batch, cpu_has_native_bf16())
    if args.only in (None, "generate"):
        rows += generation(args.reps, args.new_tokens, [1, 8])
    print(json.dumps({"rows": rows}))


if __name__ == "__main__":
    main()
