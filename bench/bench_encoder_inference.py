"""Encoder inference, side by side: lmlab against transformers on the same bert-base weights.

Batches of 32 real sentences of the default corpus in corpus order (so lengths vary as they
really do), truncated to 128 tokens. Reference: transformers' BertModel with sdpa attention,
padded to the longest sentence of each batch (how its users run it), and - for honesty - the
same with batches formed after sorting by length. Ours: the plain call ``model(**batch)`` on
a model from ``lmlab.from_pretrained`` (padding is skipped by default), the same with
``skip_padding=False`` (what the default saves), and bf16. Also batch-1 latency at 128 tokens
and peak memory of loading + inference.

    GLIBC_TUNABLES=... .venv/bin/python bench/bench_encoder_inference.py --batches 8 --reps 5
    .venv/bin/python bench/bench_encoder_inference.py --size mini --batches 1 --reps 1  # smoke

Prints JSON with medians and ratios (ours / reference); tokens/s counts real tokens only.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import alternate, environment, print_json  # noqa: E402

DEFAULT_CORPUS = "/tmp/lmlab-default-corpus"


def corpus_sentences(corpus: str, count: int, skip: int = 0) -> list[str]:
    from lmlab.text.corpus import read_corpus

    sentences = (s for d in read_corpus(corpus, "train") for s in d.sentences)
    return list(itertools.islice(sentences, skip, skip + count))


def make_checkpoint(path: Path, size: str) -> None:
    import transformers

    dims = {"base": (12, 768, 12, 3072), "mini": (4, 256, 4, 1024), "small": (4, 512, 8, 2048)}[size]
    layers, hidden, heads, inner = dims
    config = transformers.BertConfig(num_hidden_layers=layers, hidden_size=hidden,
                                     num_attention_heads=heads, intermediate_size=inner)
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(path)


def peak_memory(side: str, checkpoint: str, tokens_path: str) -> float:
    """Peak RSS (MB) of a fresh process that loads the model and runs the batches once."""
    code = f"""
import json, torch

def peak_mb():  # VmHWM: ru_maxrss would include the parent's peak (inherited across exec)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024

torch.set_num_threads(2)
batches = json.load(open({tokens_path!r}))
if {side!r} == "ours":
    import lmlab
    model = lmlab.from_pretrained({checkpoint!r})
else:
    import transformers
    model = transformers.BertModel.from_pretrained({checkpoint!r}, attn_implementation="sdpa").eval()
load = peak_mb()
with torch.inference_mode():
    for ids, mask in batches:
        model(**{{"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)}})
print(json.dumps([load, peak_mb()]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=DEFAULT_CORPUS)
    parser.add_argument("--size", default="base", choices=["base", "small", "mini"])
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip", type=int, default=50000, help="sentences skipped from the start")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import transformers

    import lmlab
    from lmlab.utils.catalog import minilm_dir

    work = Path(tempfile.mkdtemp(prefix="lmlab-bench-"))
    make_checkpoint(work, args.size)
    tokenizer = lmlab.Tokenizer.from_pretrained(minilm_dir())
    sentences = corpus_sentences(args.corpus, args.batches * args.batch_size, args.skip)

    def batches_of(texts):
        out = []
        for i in range(0, len(texts), args.batch_size):
            enc = tokenizer(texts[i:i + args.batch_size], padding=True, truncation=True,
                            max_length=128, return_tensors="pt")
            out.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]})
        return out

    corpus_order = batches_of(sentences)
    sorted_order = batches_of(sorted(sentences, key=lambda s: len(tokenizer.encode(s))))
    real_tokens = sum(int(b["attention_mask"].sum()) for b in corpus_order)
    padded_tokens = sum(b["attention_mask"].numel() for b in corpus_order)

    reference = transformers.BertModel.from_pretrained(work, attn_implementation="sdpa").eval()
    ours = lmlab.from_pretrained(work)  # as a user gets it: no setting touched
    ours_bf16 = lmlab.from_pretrained(work, dtype=torch.bfloat16)

    def throughput(model, batches, **options):
        def run():
            start = time.perf_counter()
            with torch.inference_mode():
                for batch in batches:
                    model(**batch, **options)  # the plain call
            return real_tokens / (time.perf_counter() - start)
        return run

    for model in (reference, ours, ours_bf16):  # warm-up
        throughput(model, corpus_order[:1])()
    results = alternate({
        "reference_padded": throughput(reference, corpus_order),
        "reference_length_sorted": throughput(reference, sorted_order),
        "ours_fp32": throughput(ours, corpus_order),
        "ours_fp32_padding_computed": throughput(ours, corpus_order, skip_padding=False),
        "ours_bf16": throughput(ours_bf16, corpus_order),
    }, args.reps)

    with torch.inference_mode():
        batch = corpus_order[0]
        real = batch["attention_mask"].bool()
        fp32 = ours(**batch).last_hidden_state
        bf16 = ours_bf16(**batch).last_hidden_state.float()
        ref = reference(**batch).last_hidden_state
        bf16_deviation = float((fp32[real] - bf16[real]).abs().max())
        fp32_vs_reference = float((fp32[real] - ref[real]).abs().max())

    single = tokenizer(" ".join(sentences)[:4000], truncation=True, max_length=128,
                       return_tensors="pt")

    def latency(model):
        def run():
            start = time.perf_counter()
            with torch.inference_mode():
                model(input_ids=single["input_ids"], attention_mask=single["attention_mask"])
            return (time.perf_counter() - start) * 1000
        return run

    latencies = alternate({"reference": latency(reference), "ours": latency(ours)}, args.reps * 2)

    token_file = work / "batches.json"
    token_file.write_text(json.dumps([(b["input_ids"].tolist(), b["attention_mask"].tolist())
                                      for b in corpus_order]))
    memory = {side: peak_memory(side, str(work), str(token_file)) for side in ("reference", "ours")}

    ref_median = results["reference_padded"]["median"]
    print_json({
        "environment": environment(),
        "size": args.size, "batches": args.batches, "batch_size": args.batch_size,
        "real_tokens": real_tokens, "padded_tokens": padded_tokens,
        "padding_fraction": round(1 - real_tokens / padded_tokens, 3),
        "tokens_per_s": {k: round(v["median"]) for k, v in results.items()},
        "ratios_vs_reference_padded": {k: round(v["median"] / ref_median, 2)
                                       for k, v in results.items()},
        "interference_cpu_per_s": {k: v["interference_s"] for k, v in results.items()},
        "batch1_latency_ms_128_tokens": {k: round(v["median"], 1) for k, v in latencies.items()},
        "latency_ratio_ours_over_reference": round(latencies["ours"]["median"]
                                                   / latencies["reference"]["median"], 2),
        "max_abs_dev_bf16_vs_our_fp32": bf16_deviation,
        "max_abs_dev_our_fp32_vs_reference": fp32_vs_reference,
        "peak_rss_mb_[after_load,after_inference]": memory,
    })


if __name__ == "__main__":
    main()
