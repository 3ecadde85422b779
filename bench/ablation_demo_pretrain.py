"""Ablation of the demo's pretraining recipe, at equal *tokens* rather than equal wall time.

The demo pretrains for a fixed time (9 of its 20 minutes). On a shared 2-core machine a
wall-clock race measures the neighbours as much as the recipe, so this script separates the two:

1. ``probe``: each configuration's throughput (tokens/s), from a short run (``--probe-steps``
   optimizer steps, the first logged window dropped as warm-up). Run it on a quiet machine.
2. ``train``: each configuration trains on ``--fraction x --seconds x`` *its own* tokens/s
   tokens (what it would see in the demo's pretraining share), with the LR schedule's horizon
   set by that token count, and is scored on the demo's validation batches (seed 1234): final
   MLM loss and accuracy. The result does not depend on the machine's load, only the wall time.

A configuration is a name from :data:`LEVERS` or several joined by ``+`` (later ones win):
``lr2e-3+batch16``. :data:`BASE` is the starting point (the issue's data point, lr 1e-3, no
dropout, bf16, but BERT's post-norm: a pre-norm model is saved in lmlab's own format, which the
fine-tuning loader cannot read yet). Results accumulate in ``OUT/results.json``; each
invocation prints the table (markdown) with the unigram entropy of the train shards, the loss
of a model that ignores context.

    GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736 \\
        .venv/bin/python bench/ablation_demo_pretrain.py probe --shards SHARDS --out OUT \\
        --configs base,fp32,seq64
    .venv/bin/python bench/ablation_demo_pretrain.py train --shards SHARDS --out OUT \\
        --configs base,seq64 --fraction 0.33
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BASE: dict[str, Any] = {
    "size": "mini", "lr": 1e-3, "warmup_fraction": 0.06, "schedule": "linear",
    "batch_size": 32, "seq_len": 128, "precision": "bf16",
    "model_args": {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0},
    "objective_args": {"mask_prob": 0.15, "sparse": True},
}
LEVERS: dict[str, dict[str, Any]] = {
    "base": {},
    "fp32": {"precision": "fp32"},
    "lr5e-4": {"lr": 5e-4}, "lr2e-3": {"lr": 2e-3}, "lr3e-3": {"lr": 3e-3},
    "warmup0": {"warmup_fraction": 0.0}, "onecycle": {"warmup_fraction": 0.5},
    "cosine": {"schedule": "cosine"}, "floor10": {"min_lr_ratio": 0.1},
    "seq32": {"seq_len": 32}, "seq64": {"seq_len": 64}, "seq256": {"seq_len": 256},
    "batch8": {"batch_size": 8}, "batch16": {"batch_size": 16}, "batch64": {"batch_size": 64},
    "mask25": {"objective_args": {"mask_prob": 0.25}},
    "mask40": {"objective_args": {"mask_prob": 0.4}},
    "dense": {"objective_args": {"sparse": False}},
    "dropout": {"model_args": {"hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}},
    "prenorm": {"model_args": {"pre_norm": True, "final_norm": True}},
    "rotary": {"model_args": {"position_embedding": "rotary"}},
    "beta98": {"betas": [0.9, 0.98]},
    "tiny": {"size": "tiny"}, "small": {"size": "small"},
    "layers2": {"model_args": {"num_hidden_layers": 2}},
    "layers6": {"model_args": {"num_hidden_layers": 6}},
    "narrow192": {"model_args": {"hidden_size": 192, "intermediate_size": 768,
                                 "num_attention_heads": 3}},
}


# settings that change what is computed per token, not how fast: their levers share a probe
SPEED_NEUTRAL = ("lr", "warmup_fraction", "schedule", "min_lr_ratio", "betas")


def probe_name(name: str) -> str:
    """The configuration whose throughput ``name`` has: ``name`` without its speed-neutral
    levers (``lr2e-3+batch16`` runs as fast as ``batch16``; ``lr2e-3`` as ``base``)."""
    kept = [lever for lever in name.split("+")
            if not set(LEVERS[lever]) <= set(SPEED_NEUTRAL) or lever == "base"]
    return "+".join(kept) or "base"


def resolve(name: str) -> dict[str, Any]:
    """The settings of configuration ``name`` (levers joined by ``+``) on top of :data:`BASE`;
    nested mappings (``model_args``, ``objective_args``) merge key by key."""
    settings = json.loads(json.dumps(BASE))
    for lever in name.split("+"):
        if lever not in LEVERS:
            raise SystemExit(f"unknown lever {lever!r}; known: {', '.join(LEVERS)}")
        for key, value in LEVERS[lever].items():
            if isinstance(value, dict):
                settings[key] = {**settings[key], **value}
            else:
                settings[key] = value
    return settings


def planned_tokens(tokens_per_s: float, seconds: float, fraction: float) -> int:
    """Tokens a configuration trains on: its throughput x the demo's pretraining seconds x
    ``fraction`` (1 for a full-length run), rounded to thousands."""
    return int(round(tokens_per_s * seconds * fraction, -3))


def _pretrain(settings: dict[str, Any], shards: Path, out: Path, threads: int,
              **stop: Any) -> dict[str, Any]:
    import lmlab
    from lmlab.training import TrainingConfig
    from lmlab.training.pretrain import DataSettings, ModelSettings, ObjectiveSettings

    training = TrainingConfig(
        lr=settings["lr"], warmup_fraction=settings["warmup_fraction"],
        schedule=settings["schedule"], min_lr_ratio=settings.get("min_lr_ratio", 0.0),
        betas=tuple(settings.get("betas", (0.9, 0.999))),
        seq_len=settings["seq_len"], batch_size=settings["batch_size"], seed=0,
        precision=settings["precision"], threads=threads, progress=False, log_every=10, **stop)
    result = lmlab.pretrain(lmlab.PretrainConfig(
        out=out, training=training, overwrite=True, track_cost=False,
        model=ModelSettings("bert", settings["size"], model_args=settings["model_args"]),
        objective=ObjectiveSettings("mlm", settings["objective_args"]),
        data=DataSettings(shards, None, 8 if "max_tokens" in stop else 1)))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"result": result, "rows": rows}


def throughput(results: dict[str, Any], name: str) -> dict[str, Any]:
    """The probe of ``name`` (see :func:`probe_name`), or, for a combination never probed, an
    estimate: base's tokens/s times each lever's probed ratio to base (``estimated``)."""
    key = probe_name(name)
    if "probe" in results.get(key, {}):
        return results[key]["probe"]
    levers = [lever for lever in key.split("+") if lever != "base"]
    missing = [lever for lever in ["base", *levers] if "probe" not in results.get(lever, {})]
    if missing:
        raise SystemExit(f"{name} has no throughput yet: run `probe --configs {key}` (or probe "
                         f"{', '.join(missing)} for an estimate)")
    base = results["base"]["probe"]["tokens_per_s"]
    rate = base
    for lever in levers:
        rate *= results[lever]["probe"]["tokens_per_s"] / base
    return {"tokens_per_s": rate, "estimated": True}


def probe(name: str, shards: Path, work: Path, steps: int, threads: int) -> dict[str, Any]:
    """Tokens/s of ``name``: median of the logged windows after the first (warm-up)."""
    run = _pretrain(resolve(name), shards, work / name, threads, max_steps=steps)
    rates = [r["tokens_per_s"] for r in run["rows"] if r.get("kind") == "train"][1:]
    if not rates:
        raise SystemExit(f"{name}: too few steps to measure; raise --probe-steps")
    return {"tokens_per_s": statistics.median(rates), "windows": len(rates)}


def train(name: str, shards: Path, work: Path, tokens: int, threads: int) -> dict[str, Any]:
    """Train ``name`` on ``tokens`` tokens; final validation MLM loss and accuracy at its own
    masking rate, and at 15% (``val_loss_15``: comparable across masking rates)."""
    from lmlab.demo.analysis import masked_lm_score

    started = time.perf_counter()
    settings = resolve(name)
    run = _pretrain(settings, shards, work / name, threads, max_tokens=tokens)
    evals = [r for r in run["rows"] if r.get("kind") == "eval"]
    curve = [(r["tokens"], round(r["eval_mlm_loss"], 4)) for r in evals]
    # one validation set for every configuration: 8 batches of 32 x 128 (the run's own
    # evaluation uses its batch size and length, so its windows differ between configurations)
    at15 = masked_lm_score(work / name / "model", shards, batch_size=32, seq_len=128)
    return {"tokens": run["result"].tokens, "steps": run["result"].step,
            "val_loss": evals[-1]["eval_mlm_loss"], "val_accuracy": evals[-1]["eval_mlm_accuracy"],
            "val_loss_15": at15["loss"], "val_accuracy_15": at15["accuracy"],
            "curve": curve, "wall_s": round(time.perf_counter() - started, 1)}


def table(results: dict[str, Any], baseline: dict[str, float]) -> str:
    """The results as a markdown table (one row per configuration that has been trained)."""
    from lmlab.utils.host import describe_host

    lines = [f"Unigram entropy of the train shards {baseline['entropy']:.2f} nats, most frequent "
             f"piece {baseline['majority_accuracy']:.1%}; host: {describe_host()}.", "",
             "| configuration | tokens/s | fraction | tokens seen | steps | val loss | "
             "below unigram | val acc | at 15% masking: loss, acc |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, entry in results.items():
        for key, run in sorted(entry.get("train", {}).items()):
            estimated = " (est.)" if entry["probe"].get("estimated") else ""
            lines.append(
                f"| {name} | {entry['probe']['tokens_per_s']:,.0f}{estimated} | {key} | "
                f"{run['tokens'] / 1e6:.2f}M | {run['steps']:,} | {run['val_loss']:.3f} | "
                f"{baseline['entropy'] - run['val_loss']:.2f} | {run['val_accuracy']:.1%} | "
                + (f"{run['val_loss_15']:.3f}, {run['val_accuracy_15']:.1%} |"
                   if "val_loss_15" in run else "- |"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=("probe", "train", "table"))
    parser.add_argument("--shards", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--configs", default="base")
    parser.add_argument("--seconds", type=float, default=540.0,
                        help="the demo's pretraining seconds (45%% of 20 minutes)")
    parser.add_argument("--fraction", type=float, default=1.0)
    parser.add_argument("--probe-steps", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from lmlab.demo.analysis import unigram_baseline, unigram_counts
    from lmlab.utils.io import atomic_write_json

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    names = [n for n in args.configs.split(",") if n] if args.mode != "table" else []
    for name in names:
        resolve(name)  # every name checked before any work
    work = args.out / "runs"
    for name in names:
        entry = results.setdefault(name, {})
        entry["settings"] = resolve(name)
        if args.mode == "probe":
            entry["probe"] = probe(name, args.shards, work, args.probe_steps, args.threads)
            print(f"{name}: {entry['probe']['tokens_per_s']:,.0f} tokens/s", flush=True)
        else:
            entry["probe"] = throughput(results, name)
            tokens = planned_tokens(entry["probe"]["tokens_per_s"], args.seconds, args.fraction)
            run = train(name, args.shards, work, tokens, args.threads)
            entry.setdefault("train", {})[f"{args.fraction:g}"] = run
            print(f"{name}: {run['tokens']:,} tokens, val loss {run['val_loss']:.3f}, "
                  f"acc {run['val_accuracy']:.1%} ({run['wall_s']:.0f} s)", flush=True)
        shutil.rmtree(work / name, ignore_errors=True)
        atomic_write_json(path, results)
    print(table(results, unigram_baseline(unigram_counts(args.shards))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
