"""Inference speed of pruned and factorised models against the FLOPs they remove.

For all-MiniLM-L6-v2 (``--model minilm``) or a randomly initialised BERT-base-shaped encoder
(``--model bert-base``): the unpruned model, the same model with 25/50/75% of its attention heads
removed (the same number in every layer, chosen by :func:`lmlab.compress.heads.prune_heads`, so
the matrices really shrink), and every layer's linear maps factorised at the ranks of
``--ranks`` (:mod:`lmlab.compress.lowrank`). For each variant: the forward FLOPs counted by
``FlopCounterMode`` on the timed batch, attention products included (so the removed fraction
is measured, not assumed), the
parameters, and the median forward time of the batch (real wordnet-supersense dev sentences,
MiniLM's tokenizer, concatenated and cut into ``--batch`` rows of ``--length`` tokens: no
padding), the variants alternating each repetition.
The speed-up of a variant is base time / its time; proportional speed-up would equal
1 / (1 - removed FLOP fraction).

    OMP_NUM_THREADS=2 python bench/bench_pruning.py --model minilm --reps 7
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import alternate, print_json  # noqa: E402


def base_model(name: str):
    import torch

    from lmlab.models.config import TransformerConfig
    from lmlab.models.model import LanguageModel

    if name == "minilm":
        import lmlab
        from lmlab.utils.catalog import minilm_dir

        return lmlab.from_pretrained(minilm_dir()).eval()
    torch.manual_seed(0)
    return LanguageModel(TransformerConfig()).eval()  # BERT-base's shape (the defaults)


def batch(size: int, length: int) -> dict:
    import torch

    from lmlab.finetune import data as fdata
    from lmlab.finetune.runner import load_tokenizer
    from lmlab.tasks import load_builtin_task
    from lmlab.utils.catalog import minilm_dir

    task = load_builtin_task("wordnet-supersense")
    tokenizer = load_tokenizer(minilm_dir())
    features = fdata.encode_examples(task, task.split("dev"), tokenizer, length, split="dev")
    stream = [token for feature in features for token in feature.input_ids]  # [CLS] .. [SEP] ..
    if len(stream) < size * length:
        raise SystemExit(f"the dev split holds {len(stream)} tokens, fewer than {size} x {length}")
    ids = torch.tensor(stream[:size * length]).view(size, length)  # (B, T): no padding
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def variants(model, fractions: list[float], ranks: list[int]) -> dict:
    from lmlab.compress.heads import heads_per_layer, prune_heads
    from lmlab.compress.lowrank import low_rank

    found = {"unpruned": model}
    heads = heads_per_layer(model)[0]
    for fraction in fractions:
        remove = round(fraction * heads)
        pruned = copy.deepcopy(model)
        prune_heads(pruned, {layer: list(range(remove)) for layer in range(len(heads_per_layer(
            pruned)))})
        found[f"heads -{fraction:.0%}"] = pruned
    for rank in ranks:
        factorised = copy.deepcopy(model)
        low_rank(factorised, rank=rank)
        found[f"svd rank {rank}"] = factorised
    return found


def main() -> int:
    import torch

    from lmlab.cost.flop_counter import measure_flops
    from lmlab.models.model import count_parameters
    from lmlab.utils.host import describe_host

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("minilm", "bert-base"), default="minilm")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--fractions", default="0.25,0.5,0.75")
    parser.add_argument("--ranks", default="")
    args = parser.parse_args()
    fractions = [float(x) for x in args.fractions.split(",") if x]
    hidden = 384 if args.model == "minilm" else 768
    ranks = [int(x) for x in args.ranks.split(",") if x] or [hidden // 4, hidden // 8]

    inputs = batch(args.batch, args.length)
    models = variants(base_model(args.model), fractions, ranks)
    # output_attentions: the eager attention path, whose score and context products the
    # counter sees (it does not count the CPU fused SDPA kernel the timed runs use)
    flops = {name: measure_flops(m, {**inputs, "output_attentions": True}, training=False)[0]
             for name, m in models.items()}

    def timer(model):
        def run() -> float:
            start = time.perf_counter()
            with torch.inference_mode():
                model(**inputs)
            return time.perf_counter() - start
        return run

    for model in models.values():  # warm-up: allocations, kernel choice
        timer(model)()
    timings = alternate({name: timer(m) for name, m in models.items()}, args.reps)
    base_time, base_flops = timings["unpruned"]["median"], flops["unpruned"]
    rows = []
    for name, model in models.items():
        removed = 1 - flops[name] / base_flops
        speedup = base_time / timings[name]["median"]
        rows.append({"variant": name, "parameters": count_parameters(model),
                     "gflops": flops[name] / 1e9, "flops_removed": removed,
                     "median_s": timings[name]["median"], "speedup": speedup,
                     "proportional_speedup": 1 / (1 - removed),
                     "interference_s": timings[name]["interference_s"]})
    print_json({"host": describe_host(), "model": args.model, "batch": args.batch,
                "length": args.length, "tokens": int(inputs["attention_mask"].sum()),
                "reps": args.reps, "rows": rows})
    print(f"\n{args.model}, batch {args.batch} x {args.length} tokens, {describe_host()}\n")
    print("| variant | parameters | GFLOPs | FLOPs removed | median s | speed-up | "
          "proportional |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['variant']} | {r['parameters'] / 1e6:.1f}M | {r['gflops']:.1f} | "
              f"{r['flops_removed']:.0%} | {r['median_s']:.3f} | {r['speedup']:.2f}x | "
              f"{r['proportional_speedup']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
