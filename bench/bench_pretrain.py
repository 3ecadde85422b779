"""Training throughput: lmlab's Trainer (bert MLM) vs transformers' BertForMaskedLM.

Both sides train the same architecture (random init, BERT vocabulary 30522) on the same token
ids, masked at collate time (ours: ``MaskedLM.corrupt`` in the stream; theirs:
``DataCollatorForLanguageModeling``, 15%, 80/10/10), with AdamW (weight decay 0.01 except biases
and LayerNorm weights), linear warmup + decay, clipping at 1.0, in one process, alternating
A B A B. Ours runs its fast path: sparse MLM prediction (vocabulary projection only at masked
positions); ``ours-bf16`` adds bf16 autocast (weights fp32). Reported: median tokens/s over the
timed steps of each repetition, then the median over repetitions, and ours/reference.
With ``--memory`` each side also trains once in a fresh process and reports its peak resident
memory (``VmHWM`` of /proc/self/status: the whole process, Python and torch included). With
``--profile`` each side's steps run under ``torch.profiler`` and the self CPU time is printed
by kind of operator (matmuls, attention, optimizer, the rest), per step: the table that
explains a ratio. With ``--device cuda`` both sides train on the GPU, and two more sides run:
``reference-bf16`` (transformers under bf16 autocast) and ``ours-bf16-compile`` (ours with
``compile=True``); each repetition also reports the peak GPU memory. On a machine without the
MiniLM package, ``BENCH_BERT_TOKENIZER`` names a folder with BERT's uncased tokenizer files.

Run it as the Makefile does, under the same allocator settings for both sides:

    GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736 \\
        .venv/bin/python bench/bench_pretrain.py --sizes mini --reps 3 --steps 6
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

SIZES = {  # name: (layers, hidden, batch)
    "mini": (4, 256, 32),
    "small": (4, 512, 32),
    "base": (12, 768, 8),
}
VOCAB, SEQ, LR, WARMUP = 30522, 128, 1e-4, 2
CLS, SEP, PAD, MASK = 101, 102, 0, 103


def batches(batch: int, count: int, seed: int = 0) -> list[torch.Tensor]:
    """Token-id rows [CLS] ... [SEP] (ids drawn from the text range of the vocabulary)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        ids = torch.randint(1000, VOCAB, (batch, SEQ), generator=g)
        ids[:, 0], ids[:, -1] = CLS, SEP
        out.append(ids)
    return out


def cpu_of_others() -> float:
    """CPU seconds used by all processes but this one so far (interference record)."""
    with open("/proc/stat") as handle:
        fields = handle.readline().split()[1:]
    total = sum(int(v) for v in fields[:3]) / os.sysconf("SC_CLK_TCK")
    own = sum(os.times()[:2])
    return total - own


# -- ours ---------------------------------------------------------------------------------------
class _Stream:
    def __init__(self, rows: list[torch.Tensor], objective):
        self.rows, self.objective, self.index = rows, objective, 0
        self.rng = torch.Generator().manual_seed(1)

    def __iter__(self):
        while True:
            ids = self.rows[self.index % len(self.rows)]
            self.index += 1
            batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                     "token_type_ids": torch.zeros_like(ids)}
            yield self.objective.corrupt(batch, self.rng)

    def state_dict(self):
        return {"index": self.index}

    def load_state_dict(self, state):
        self.index = state["index"]


def run_ours(size: str, rows: list[torch.Tensor], steps: int, precision: str,
             device: str = "cpu", compile: bool = False) -> list[float]:
    from lmlab.models.model import LanguageModel
    from lmlab.models.presets import preset
    from lmlab.objectives.registry import build_objective
    from lmlab.objectives.special_tokens import SpecialTokens
    from lmlab.training.config import TrainingConfig
    from lmlab.training.metrics_log import read_metrics
    from lmlab.training.trainer import Trainer

    layers, hidden, batch = SIZES[size]
    torch.manual_seed(0)
    special = SpecialTokens(vocab_size=VOCAB, pad_id=PAD, cls_id=CLS, sep_id=SEP, mask_id=MASK,
                            special_ids=(100,))
    objective = build_objective("mlm", special)
    model = LanguageModel(preset("bert", size), heads=["mlm"])
    cfg = TrainingConfig(lr=LR, warmup_steps=WARMUP, max_steps=steps, log_every=1,
                         progress=False, precision=precision, batch_size=batch, seq_len=SEQ,
                         keep_last=1, device=device, compile=compile)
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(model, objective, _Stream(rows, objective), cfg, out, track_cost=False)
        trainer._finish = lambda cost: None  # no final model/report: not part of a step
        trainer.train()
        records = [r for r in read_metrics(os.path.join(out, "metrics.jsonl"))
                   if r["kind"] == "train"]
    return [r["tokens_per_s"] for r in records[1:]]  # step 1 warms up (and compiles)


# -- reference ----------------------------------------------------------------------------------
def run_reference(size: str, rows: list[torch.Tensor], steps: int, device: str = "cpu",
                  bf16: bool = False) -> list[float]:
    """transformers' BertForMaskedLM in a plain loop; ``bf16``: under bf16 autocast (weights
    fp32), as ``--precision bf16`` runs ours. The loss and the gradient norm are read back each
    step, as our Trainer reads them for its log: on a GPU that is where both sides wait for the
    step's kernels."""
    from transformers import (
        BertConfig,
        BertForMaskedLM,
        BertTokenizerFast,
        DataCollatorForLanguageModeling,
        get_linear_schedule_with_warmup,
    )

    from lmlab.utils.catalog import minilm_dir

    layers, hidden, batch = SIZES[size]
    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=hidden // 64, intermediate_size=4 * hidden,
                        attn_implementation="sdpa")
    model = BertForMaskedLM(config).to(device).train()
    # BERT's uncased vocabulary (the collator reads its [MASK] and special ids)
    tokenizer = BertTokenizerFast.from_pretrained(os.environ.get("BENCH_BERT_TOKENIZER")
                                                  or str(minilm_dir()))
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    no_decay = ("bias", "LayerNorm.weight")
    groups = [
        {"params": [p for n, p in model.named_parameters() if not n.endswith(no_decay)],
         "weight_decay": 0.01},
        {"params": [p for n, p in model.named_parameters() if n.endswith(no_decay)],
         "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.999), eps=1e-6)
    scheduler = get_linear_schedule_with_warmup(optimizer, WARMUP, steps)
    rates = []
    for step in range(steps):
        started = time.perf_counter()
        ids = rows[step % len(rows)]
        features = collator([{"input_ids": row} for row in ids.tolist()])
        features = {k: v.to(device) for k, v in features.items()}
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
            loss = model(**features).loss
        loss.backward()
        float(loss)
        float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        rates.append(ids.numel() / (time.perf_counter() - started))
    return rates[1:]


OPERATOR_KINDS = (  # (kind, substrings of aten operator names): the first match wins
    ("loss (log-softmax, cross-entropy)", ("log_softmax", "nll_loss", "cross_entropy")),
    ("attention", ("attention", "bmm", "softmax")),
    ("layer norm", ("layer_norm",)),
    ("matmul (linear layers, vocabulary projection)", ("addmm", "mm", "linear", "matmul")),
    ("optimizer (AdamW, clipping)", ("_foreach", "adam", "norm", "clamp", "lerp", "addcdiv",
                                     "addcmul", "sqrt")),
    ("gelu / dropout", ("gelu", "dropout", "bernoulli")),
    ("embedding, gather, index", ("embedding", "index", "gather", "scatter", "masked")),
    ("copies and casts", ("copy", "to", "contiguous", "clone", "cat", "fill", "zero")),
)


def profile_side(fn, steps: int) -> dict[str, float]:
    """Self CPU milliseconds per training step of ``fn`` (which runs ``steps`` steps, the
    warm-up step included), summed by OPERATOR_KINDS; the rest is "other"."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    kinds: dict[str, float] = {}
    for event in prof.key_averages():
        if not event.key.startswith("aten::"):
            continue
        name = event.key[len("aten::"):]
        kind = next((k for k, keys in OPERATOR_KINDS if any(x in name for x in keys)), "other")
        kinds[kind] = kinds.get(kind, 0.0) + event.self_cpu_time_total / 1000 / steps
    return kinds


def print_profiles(title: str, profiles: dict[str, dict[str, float]]) -> None:
    """One table: a row per kind of operator, a column per side (ms per step)."""
    names = list(profiles)
    kinds = sorted({k for p in profiles.values() for k in p},
                   key=lambda k: -profiles[names[0]].get(k, 0.0))
    print(f"{title} self CPU ms per step (torch.profiler):")
    print(f"  {'kind':48s} " + " ".join(f"{n:>15s}" for n in names))
    for kind in kinds:
        print(f"  {kind:48s} " + " ".join(f"{profiles[n].get(kind, 0.0):15,.0f}"
                                            for n in names))
    print(f"  {'total':48s} " + " ".join(f"{sum(profiles[n].values()):15,.0f}"
                                          for n in names))


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM) in MB; unlike ru_maxrss it is not inherited
    across fork/exec."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def measure_memory(size: str, side: str, steps: int, threads: int | None) -> float:
    """Peak RSS (MB) of a fresh process that trains ``side`` for ``steps`` steps."""
    command = [sys.executable, os.path.abspath(__file__), "--child", side, "--sizes", size,
               "--steps", str(steps), "--batch-size", str(SIZES[size][2])] + (
                   ["--threads", str(threads)] if threads else [])
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return float(output.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="mini", help="comma-separated: mini,small,base")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6, help="steps per repetition (1st untimed)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--memory", action="store_true",
                        help="also measure each side's peak RSS in a fresh process")
    parser.add_argument("--force-bf16", action="store_true",
                        help="time bf16 even on a CPU without bf16 instructions")
    parser.add_argument("--profile", action="store_true",
                        help="also profile each side's steps by kind of operator")
    parser.add_argument("--batch-size", type=int,
                        help="rows per step for every size (default: the size's own, SIZES)")
    parser.add_argument("--device", default="cpu",
                        help="cpu, or cuda: adds reference-bf16 and ours-bf16-compile")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # internal: one side, print VmHWM
    args = parser.parse_args()
    if args.memory and args.device != "cpu":
        parser.error("--memory measures a process's resident memory on the CPU; on a GPU each "
                     "repetition already reports the peak GPU memory")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.batch_size:
        for name, (layers, hidden, _) in SIZES.items():
            SIZES[name] = (layers, hidden, args.batch_size)
    os.environ.setdefault("LMLAB_NO_PROGRESS", "1")
    if args.child:
        size = args.sizes.split(",")[0]
        rows = batches(SIZES[size][2], args.steps)
        if args.child == "reference-fp32":
            run_reference(size, rows, args.steps)
        else:
            run_ours(size, rows, args.steps, args.child.split("-")[1])
        print(f"{peak_rss_mb():.1f}")
        return 0
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"threads {torch.get_num_threads()}, GLIBC_TUNABLES="
          f"{os.environ.get('GLIBC_TUNABLES', '(unset)')}")
    device = args.device
    sides = {
        "reference-fp32": lambda size, rows: run_reference(size, rows, args.steps, device),
        "ours-fp32": lambda size, rows: run_ours(size, rows, args.steps, "fp32", device),
        "ours-bf16": lambda size, rows: run_ours(size, rows, args.steps, "bf16", device),
    }
    if device.startswith("cuda"):
        print(f"device: {torch.cuda.get_device_name(device)}")
        sides["reference-bf16"] = lambda size, rows: run_reference(size, rows, args.steps,
                                                                   device, bf16=True)
        sides["ours-bf16-compile"] = lambda size, rows: run_ours(size, rows, args.steps, "bf16",
                                                                 device, compile=True)
    from lmlab.cost.precision import cpu_has_native_bf16

    if device == "cpu" and cpu_has_native_bf16() is False and not args.force_bf16:
        del sides["ours-bf16"]
        print("ours-bf16 skipped: this CPU has no bf16 instructions, so bf16 matmuls are "
              "emulated (5-60x slower than fp32); --force-bf16 runs it anyway")
    for size in args.sizes.split(","):
        rows = batches(SIZES[size][2], args.steps)
        results: dict[str, list[float]] = {name: [] for name in sides}
        for rep in range(args.reps):
            for name, fn in sides.items():  # A B C, A B C, ...
                others = cpu_of_others()
                if device.startswith("cuda"):
                    torch.cuda.reset_peak_memory_stats(device)
                started = time.perf_counter()
                rate = statistics.median(fn(size, rows))
                wall = time.perf_counter() - started
                busy = (cpu_of_others() - others) / wall
                results[name].append(rate)
                memory = (f", peak GPU memory {torch.cuda.max_memory_allocated(device) / 2**20:,.0f}"
                          " MiB" if device.startswith("cuda") else "")
                print(f"  {size} rep {rep} {name:17s} {rate:9,.0f} tokens/s "
                      f"(other processes: {busy:.2f} cores{memory})", flush=True)
        medians = {name: statistics.median(v) for name, v in results.items()}
        ref = medians["reference-fp32"]
        print(f"{size}: " + ", ".join(f"{n} {m:,.0f}" for n, m in medians.items()) +
              f" | ours-fp32/ref {medians['ours-fp32'] / ref:.2f}x"
              + (f", ours-bf16/ref {medians['ours-bf16'] / ref:.2f}x"
                 if "ours-bf16" in medians else "")
              + (f", ours-bf16/reference-bf16 "
                 f"{medians['ours-bf16'] / medians['reference-bf16']:.2f}x, "
                 f"ours-bf16-compile/reference-bf16 "
                 f"{medians['ours-bf16-compile'] / medians['reference-bf16']:.2f}x"
                 if "reference-bf16" in medians else ""))
        if args.profile:
            print_profiles(size, {name: profile_side(
                lambda fn=fn, size=size, rows=rows: fn(size, rows), args.steps)
                for name, fn in sides.items() if name != "ours-bf16"})
        if args.memory:
            peaks = {name: measure_memory(size, name, args.steps, args.threads)
                     for name in ("reference-fp32", "ours-fp32")}
            print(f"{size} peak RSS (fresh process, {args.steps} steps): " + ", ".join(
                f"{n} {m:,.0f} MB" for n, m in peaks.items()) +
                f" | ours/ref {peaks['ours-fp32'] / peaks['reference-fp32']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
