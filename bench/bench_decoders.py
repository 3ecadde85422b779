"""Decoder benchmarks: lmlab vs transformers, side by side in one process, A B A B.

1. Causal-LM training throughput (tokens/s): GPT-2 6 layers x 384, batch 8 x 256, AdamW step,
   random weights; ours (the clm objective, as ``lmlab pretrain`` runs it: fused projection +
   loss) fp32 vs theirs (``GPT2LMHeadModel(..., labels=...)``) fp32, and ours bf16 autocast vs
   theirs fp32.
2. Generation throughput (new tokens/s) with the key/value cache on SmolLM2-135M (the real
   GGUF), greedy, batch 1 and batch 8, fp32 and bf16, ours vs transformers' ``generate``.
3. Peak resident memory of loading the GGUF (fresh subprocess per side).

Medians of ``--reps`` alternated repetitions; the ratio is ours / reference (> 1: ours faster).
Run:  GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736 \\
      .venv/bin/python bench/bench_decoders.py --reps 5
(``--quick`` for a short run; the machine is shared, so record the load.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch


def _median_pair(run_a, run_b, reps: int) -> tuple[float, float]:
    a, b = [], []
    for _ in range(reps):
        a.append(run_a())
        b.append(run_b())
    return statistics.median(a), statistics.median(b)


# -- 1. training ---------------------------------------------------------------------------------
def training(reps: int, steps: int, batch: int, seq: int,
             with_bf16: bool = True, profile: bool = False) -> list[dict]:
    import transformers

    from lmlab.models.model import LanguageModel
    from lmlab.models.presets import preset

    config = preset("gpt2", "6x384", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ours = LanguageModel(config, heads=("clm",)).train()
    hf_config = transformers.GPT2Config(n_embd=384, n_layer=6, n_head=6, n_positions=1024,
                                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    theirs = transformers.GPT2LMHeadModel(hf_config).train()
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    opt_a = torch.optim.AdamW(ours.parameters(), lr=1e-4)
    opt_b = torch.optim.AdamW(theirs.parameters(), lr=1e-4)

    # ours runs what `lmlab pretrain --objective clm` runs: the objective's fused
    # projection + loss (no full logits), on the same ids as labels
    from lmlab.objectives import SpecialTokens, build_objective

    eos = config.vocab_size - 1
    objective = build_objective("clm", SpecialTokens(vocab_size=config.vocab_size, pad_id=eos,
                                                     cls_id=eos, sep_id=eos, eos_id=eos))
    batch_ours = objective.corrupt({"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                                   torch.Generator().manual_seed(0))

    def step_ours(bf16: bool) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = objective.compute_loss(ours, batch_ours).loss
        loss.backward()
        opt_a.step()
        opt_a.zero_grad(set_to_none=True)

    def step_theirs() -> None:
        loss = theirs(input_ids=ids, labels=ids).loss
        loss.backward()
        opt_b.step()
        opt_b.zero_grad(set_to_none=True)

    def timed(fn):
        def run() -> float:
            fn()  # warm-up step
            start = time.perf_counter()
            for _ in range(steps):
                fn()
            return steps * batch * seq / (time.perf_counter() - start)
        return run

    if profile:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from bench_pretrain import print_profiles, profile_side

        def profiled(fn):
            def run() -> None:
                for _ in range(steps):
                    fn()
            return run

        step_ours(False)
        step_theirs()  # warm-up outside the profile
        print_profiles("gpt2 6x384 8x256", {
            "reference-fp32": profile_side(profiled(step_theirs), steps),
            "ours-fp32": profile_side(profiled(lambda: step_ours(False)), steps)})
    rows = []
    settings = [("fp32 vs fp32", False)] + ([("ours bf16 vs theirs fp32", True)] if with_bf16
                                            else [])
    for label, bf16 in settings:
        a, b = _median_pair(timed(lambda bf16=bf16: step_ours(bf16)), timed(step_theirs), reps)
        rows.append({"bench": "train gpt2 6x384 8x256", "setting": label,
                     "ours_tok_s": round(a), "ref_tok_s": round(b), "ratio": round(a / b, 2)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


# -- 2. generation -------------------------------------------------------------------------------
def generation(reps: int, new_tokens: int, batches: list[int], dtypes: list[str]) -> list[dict]:
    import transformers  # noqa: F401

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from test_gguf import transformers_gguf_model

    import lmlab
    from lmlab.generation.generate import generate
    from lmlab.utils.catalog import smollm2_gguf

    path = smollm2_gguf()
    ours32 = lmlab.from_pretrained(path)
    theirs32 = transformers_gguf_model(path)
    tok = lmlab.Tokenizer.from_pretrained(path)
    prompt = tok.encode("Once upon a time, in a small village by the sea, there lived")
    rows = []
    for dtype_name in dtypes:
        dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
        ours, theirs = ours32.to(dtype), theirs32.to(dtype)
        for batch in batches:
            ids = torch.tensor([prompt] * batch)

            def run_ours(ours=ours, ids=ids, batch=batch) -> float:
                start = time.perf_counter()
                out = generate(ours, ids, max_new_tokens=new_tokens, eos_token_id=[])
                assert out.shape[1] == ids.shape[1] + new_tokens
                return batch * new_tokens / (time.perf_counter() - start)

            def run_theirs(theirs=theirs, ids=ids, batch=batch) -> float:
                start = time.perf_counter()
                with torch.no_grad():
                    out = theirs.generate(ids, attention_mask=torch.ones_like(ids),
                                          max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                          do_sample=False, pad_token_id=2)
                assert out.shape[1] == ids.shape[1] + new_tokens
                return batch * new_tokens / (time.perf_counter() - start)

            run_ours()
            run_theirs()  # warm-up
            a, b = _median_pair(run_ours, run_theirs, reps)
            rows.append({"bench": f"generate smollm2 batch {batch}", "setting": dtype_name,
                         "ours_tok_s": round(a, 1), "ref_tok_s": round(b, 1),
                         "ratio": round(a / b, 2)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


# -- 3. load memory ------------------------------------------------------------------------------
_LOAD = {
    "ours": "import lmlab; from lmlab.utils.catalog import smollm2_gguf; "
            "lmlab.from_pretrained(smollm2_gguf())",
    "transformers": "import sys; sys.path.insert(0, 'tests'); "
                    "from test_gguf import transformers_gguf_model; "
                    "from lmlab.utils.catalog import smollm2_gguf; "
                    "transformers_gguf_model(smollm2_gguf())",
}


def load_memory() -> list[dict]:
    rows = []
    for side, code in _LOAD.items():
        # VmHWM, not ru_maxrss: after fork + exec ru_maxrss still holds the parent's peak
        script = ("import time; t = time.perf_counter(); " + code +
                  "; hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')]"
                  "; print(time.perf_counter() - t, int(hwm[0].split()[1]) / 1024)")
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             cwd=os.path.join(os.path.dirname(__file__), ".."), check=True)
        seconds, rss = map(float, out.stdout.split()[-2:])
        rows.append({"bench": "load SmolLM2 GGUF", "setting": side, "seconds": round(seconds, 1),
                     "peak_rss_mb": round(rss)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="fewer steps and tokens")
    parser.add_argument("--only", choices=["train", "generate", "memory"])
    parser.add_argument("--force-bf16", action="store_true",
                        help="time bf16 even on a CPU without bf16 instructions")
    parser.add_argument("--profile", action="store_true",
                        help="training: also print self CPU time per step by kind of operator")
    args = parser.parse_args()
    torch.manual_seed(0)
    from lmlab.cost.precision import cpu_has_native_bf16

    with_bf16 = cpu_has_native_bf16() is not False or args.force_bf16
    if not with_bf16:
        print("bf16 rows skipped: this CPU has no bf16 instructions, so bf16 matmuls are "
              "emulated (5-60x slower than fp32); --force-bf16 runs them anyway", flush=True)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')!r}", flush=True)
    if args.only in (None, "memory"):
        load_memory()
    if args.only in (None, "train"):
        training(args.reps, steps=2 if args.quick else 5, batch=8, seq=256, with_bf16=with_bf16,
                 profile=args.profile)
    if args.only in (None, "generate"):
        generation(args.reps, new_tokens=16 if args.quick else 32, batches=[1, 8],
                   dtypes=["fp32", "bf16"] if with_bf16 else ["fp32"])


if __name__ == "__main__":
    main()
