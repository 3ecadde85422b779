"""Kaplan et al. (2020)'s compute scaling at a 2-core scale: L(C) and L(N) for GPT-style decoders.

Several decoder sizes (LAYERSxHIDDEN in GPT-2's pre-norm shape: heads of 64 units or one head,
a feed-forward of 4H, no dropout) are each pretrained once with the causal-LM objective
(``lmlab.pretrain``) on the same tokens (the default corpus, or ``--corpus``; a byte-level BPE
vocabulary trained on it) for the same number of tokens, with Kaplan's warmup then cosine decay
and his learning rate for N. The held-out loss at each evaluation is the loss at that token
budget. Compute C = tokens x the run's cost-report FLOPs per token (``lmlab.cost``: matmuls, 3 x
forward, attention in full, the vocabulary projection included); Kaplan's C = 6·N·D (N the
non-embedding parameters, ``TransformerConfig.num_parameters(include_embeddings=False)``) beside
it. ``lmlab.cost.scaling`` fits L(C) = a·C^-b (C in PF-days) over the compute frontier and
L(N) = a_N·N^-b_N over each size's last evaluation.

    python scripts/scaling_fit.py --corpus CORPUS --work /work/runs/scaling --out OUT

Every stage (corpus, tokens, each pretraining) is cached under ``--work`` (lmlab.demo.stages; an
interrupted pretraining resumes). Writes ``scaling.json`` (every run and evaluation, the fits,
host and settings), ``scaling.md`` (the tables) and ``scaling.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from lmlab.cost.estimate import PF_DAY_FLOPS
from lmlab.cost.flops import flops_breakdown
from lmlab.cost.scaling import PowerLaw, compute_frontier, fit_power_law
from lmlab.data.build import build_corpus
from lmlab.data.shard_reader import ShardReader
from lmlab.data.shards import build_shards
from lmlab.demo.stages import StageRunner
from lmlab.models.config import TransformerConfig
from lmlab.models.presets import preset
from lmlab.tokenization.tokenizer import Tokenizer
from lmlab.training.metrics_log import read_metrics
from lmlab.training.pretrain import PretrainConfig, pretrain
from lmlab.training.report import pyplot, save_png
from lmlab.utils.checks import check_at_least, check_folder
from lmlab.utils.errors import LmlabError
from lmlab.utils.host import describe_host
from lmlab.utils.io import atomic_write_json, atomic_write_text

PAPER_B = {"Kaplan et al. 2020, L(C_min)": 0.050, "GPT-3 (Brown et al. 2020, Fig. 3.1)": 0.048}
PAPER_B_N = 0.076  # Kaplan et al. 2020, L(N) at convergence


def parse_size(text: str) -> tuple[int, int]:
    """``"4x128"`` -> (layers, hidden)."""
    try:
        layers, hidden = (int(v) for v in text.lower().split("x"))
    except ValueError:
        layers = hidden = 0
    if layers < 1 or hidden < 8:
        raise LmlabError(f"size {text!r} is not LAYERSxHIDDEN", "write e.g. 4x128 (hidden >= 8)")
    return layers, hidden


def shape(layers: int, hidden: int) -> dict[str, Any]:
    """GPT-2's shape rules: heads of 64 units (one head below 128), a feed-forward of 4H; no
    dropout (one pass over the data, as Kaplan's runs)."""
    return {"num_hidden_layers": layers, "hidden_size": hidden,
            "num_attention_heads": max(1, hidden // 64), "intermediate_size": 4 * hidden,
            "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def kaplan_lr(n: int) -> float:
    """Kaplan et al.'s learning rate for N non-embedding parameters (their eq. D.1)."""
    return 0.003239 - 0.0001395 * math.log(n)


def tokens_stage(stages: StageRunner, args: argparse.Namespace) -> Path:
    """The corpus (given, or the default built here) as a byte-level BPE vocabulary + shards."""
    if args.corpus:
        corpus = check_folder(args.corpus, "--corpus", "give a folder written by `lmlab data "
                              "build` (or leave --corpus out to build the default corpus)")
        key: dict[str, Any] = {"corpus": str(corpus.resolve())}
    else:
        sources = args.sources.split(",") if args.sources else None

        def build(folder: Path) -> dict[str, Any]:
            manifest = build_corpus(sources, folder / "corpus", max_documents=args.max_documents,
                                    validation_fraction=args.validation_fraction)
            return {"words": manifest["total_words"]}

        key = {"sources": sources, "max_documents": args.max_documents,
               "validation": args.validation_fraction}
        folder, _ = stages.run("corpus", key, build)
        corpus = folder / "corpus"

    def tokens(folder: Path) -> dict[str, Any]:
        tokenizer = Tokenizer.train(corpus, kind="bpe", vocab_size=args.vocab_size,
                                    show_progress=False)
        tokenizer.save_pretrained(folder / "tokenizer")
        build_shards(tokenizer, corpus, folder / "shards", show_progress=False)
        return {"vocab_size": len(tokenizer)}

    folder, _ = stages.run("tokens", {**key, "vocab": args.vocab_size}, tokens)
    return folder


def train_size(stages: StageRunner, tokens: Path, size: str, args: argparse.Namespace
               ) -> dict[str, Any]:
    """One size pretrained to ``--steps``, evaluated ``--evals`` times; its points and cost."""
    layers, hidden = parse_size(size)
    model_args = shape(layers, hidden)
    vocab = len(Tokenizer.from_pretrained(tokens / "tokenizer"))
    n = preset("gpt2", "2x128", vocab_size=vocab, **model_args).num_parameters(False)
    settings = {"family": "gpt2", "size": "2x128", "model_args": model_args, "objective": "clm",
                "seq_len": args.seq_len, "batch_size": args.batch_size,
                "lr": args.lr or round(kaplan_lr(n), 6), "warmup_fraction": args.warmup,
                "schedule": "cosine", "max_steps": args.steps, "seed": args.seed}

    def train(folder: Path) -> dict[str, Any]:
        started = time.perf_counter()
        result = pretrain(PretrainConfig.from_sections(
            None, out=folder / "run", shards=tokens / "shards", tokenizer=str(tokens / "tokenizer"),
            threads=args.threads, precision="fp32", eval_every=max(args.steps // args.evals, 1),
            eval_batches=args.eval_batches, save_every=args.steps, progress=False, **settings))
        return {"steps": result.step, "seconds": time.perf_counter() - started}

    folder, info = stages.run(f"pretrain-{size}", {"tokens": tokens.name, **settings}, train,
                              resumable=True)
    return read_run(folder / "run", size, settings, info)


def read_run(run: Path, size: str, settings: dict[str, Any], info: dict[str, Any]
             ) -> dict[str, Any]:
    """A finished run's points (tokens, FLOPs, held-out loss) from its metrics and cost report:
    C = tokens x the cost report's FLOPs per token (one sequence length, so exact)."""
    cost = json.loads((run / "cost.json").read_text())
    config = TransformerConfig.from_dict(json.loads((run / "config.json").read_text())["model"])
    parts = flops_breakdown(config, settings["seq_len"], head="clm")
    if not math.isclose(parts.total, cost["flops_per_token"], rel_tol=1e-9):
        raise LmlabError(f"{size}: the cost report's {cost['flops_per_token']:,.0f} FLOPs per "
                         f"token differ from lmlab.cost's {parts.total:,.0f}",
                         "rerun the size (its run folder is from another lmlab)")
    evals = {r["tokens"]: r["eval_loss"] for r in read_metrics(run / "metrics.jsonl")
             if r.get("kind") == "eval" and r.get("tokens")}  # a resumed run: the last wins
    n = config.num_parameters(include_embeddings=False)
    points = [{"tokens": t, "flops": t * cost["flops_per_token"], "kaplan_flops": 6.0 * n * t,
               "loss": loss} for t, loss in sorted(evals.items())]
    return {"size": size, "non_embedding_parameters": n, "parameters": cost["parameters"],
            "flops_per_token": cost["flops_per_token"],
            "vocab_projection_share": parts.output_projection / parts.total,
            "lr": settings["lr"], "tokens": cost["tokens"], "flops": cost["total_flops"],
            "final_loss": points[-1]["loss"], "train_seconds": cost["wall_seconds"],
            "stage_seconds": info.get("seconds"), "points": points}


def unigram_loss(shards: Path, vocab_size: int, tokens: int) -> float:
    """Cross-entropy (nats/token) of the training tokens' frequencies (add-one) on the first
    ``tokens`` validation tokens, those the evaluation batches hold (in order): the loss of a
    model that knows which tokens are common and nothing of their context."""
    train, held_out = ShardReader(shards, "train"), ShardReader(shards, "validation")
    counts = np.bincount(train.window(0, train.num_tokens), minlength=vocab_size) + 1.0
    log_p = np.log(counts / counts.sum())
    ids = held_out.window(0, min(tokens, held_out.num_tokens)).astype(np.int64)
    return float(-log_p[ids].mean())


def frontier_fits(runs: list[dict[str, Any]], key: str, unigram: float) -> dict[str, Any]:
    """L(C) over the frontier in ``key`` (FLOPs), C in PF-days: all of it, each half of its
    log-C range (a power law has one slope throughout), and its points below the unigram
    loss (past learning the token frequencies)."""
    points = [(p[key] / PF_DAY_FLOPS, p["loss"], r["size"]) for r in runs for p in r["points"]]
    keep = compute_frontier([p[0] for p in points], [p[1] for p in points])
    front = [points[i] for i in keep]
    c = np.array([p[0] for p in front])
    middle = math.exp((math.log(c[0]) + math.log(c[-1])) / 2)
    halves = {"lower half": [p for p in front if p[0] <= middle],
              "upper half": [p for p in front if p[0] >= middle],
              "below the unigram loss": [p for p in front if p[1] < unigram]}
    fits = {name: fit_power_law([p[0] for p in part], [p[1] for p in part]).to_dict()
            if len(part) >= 3 else None for name, part in {"all": front, **halves}.items()}
    return {"frontier": [{"pf_days": p[0], "loss": p[1], "size": p[2]} for p in front],
            "fits": fits}


def analyse(runs: list[dict[str, Any]], unigram: float) -> dict[str, Any]:
    """Both compute conventions' frontier fits and L(N) at the last evaluation."""
    law_n = fit_power_law([r["non_embedding_parameters"] for r in runs],
                          [r["final_loss"] for r in runs])
    return {"compute": frontier_fits(runs, "flops", unigram),
            "compute_kaplan_6nd": frontier_fits(runs, "kaplan_flops", unigram),
            "parameters": law_n.to_dict(), "unigram_loss": unigram}


def law(fit: dict[str, Any] | None, unit: str) -> str:
    if fit is None:
        return "(fewer than 3 points) | | "
    return f"{fit['a']:.4g} · {unit}^-{fit['b']:.4f} | {fit['r2']:.3f} | {fit['points']}"


def markdown(result: dict[str, Any]) -> str:
    """The runs table and the fits table (what docs/scaling.md shows)."""
    lines = ["| size | N (non-embedding) | FLOPs/token | vocab projection | LR | tokens | "
             "C (PF-days) | final loss | train s |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["runs"]:
        lines.append(f"| {r['size']} | {r['non_embedding_parameters']:,} | "
                     f"{r['flops_per_token']:,.0f} | {100 * r['vocab_projection_share']:.0f}% | "
                     f"{r['lr']:.2e} | {r['tokens']:,} | {r['flops'] / PF_DAY_FLOPS:.3g} | "
                     f"{r['final_loss']:.3f} | {r['train_seconds']:.0f} |")
    lines += ["", "| fit | law | R² | points |", "|---|---|---:|---:|"]
    for key, label in (("compute", "L(C), C = cost-report FLOPs"),
                       ("compute_kaplan_6nd", "L(C), C = 6·N·D (Kaplan)")):
        for part, fit in result["analysis"][key]["fits"].items():
            lines.append(f"| {label}, frontier, {part} | {law(fit, 'C')} |")
    lines.append(f"| L(N), last evaluation | {law(result['analysis']['parameters'], 'N')} |")
    lines.append(f"\nC in PF-days (8.64e19 FLOPs); losses in nats per token, held out; the "
                 f"unigram loss (token frequencies only) is {result['analysis']['unigram_loss']:.3f}.")
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> Path:
    """Log-log: each size's held-out loss against compute, the frontier and its fit (left);
    the last loss against N and its fit (right)."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for r in result["runs"]:
        left.plot([p["flops"] / PF_DAY_FLOPS for p in r["points"]],
                  [p["loss"] for p in r["points"]], "-", lw=1, alpha=0.8, label=r["size"])
    comp = result["analysis"]["compute"]
    c = np.array([p["pf_days"] for p in comp["frontier"]])
    left.plot(c, [p["loss"] for p in comp["frontier"]], "ko", ms=3, label="frontier")
    if comp["fits"]["all"] is not None:
        fit = PowerLaw(**comp["fits"]["all"])
        left.plot(c, fit(c), "k--", label=f"L = {fit.a:.3g}·C^-{fit.b:.3f} (R² {fit.r2:.2f})")
        left.plot(c, fit(c[-1]) * (c / c[-1]) ** -0.050, ":", color="grey",
                  label="slope -0.050 through the last point (Kaplan)")
    for ax in (left, right):
        ax.axhline(result["analysis"]["unigram_loss"], color="grey", lw=0.8, ls="-.",
                   label="unigram loss (token frequencies)")
    left.set(xscale="log", yscale="log", xlabel="compute C (PF-days, cost-report FLOPs)",
             ylabel="held-out loss (nats/token)", title="L(C): per-size curves and frontier")
    left.legend(fontsize=7)
    n = np.array([r["non_embedding_parameters"] for r in result["runs"]], dtype=float)
    law_n = PowerLaw(**result["analysis"]["parameters"])
    right.plot(n, [r["final_loss"] for r in result["runs"]], "o")
    right.plot(n, law_n(n), "k--", label=f"L = {law_n.a:.3g}·N^-{law_n.b:.3f} "
               f"(R² {law_n.r2:.2f})")
    right.set(xscale="log", yscale="log", xlabel="non-embedding parameters N",
              ylabel="held-out loss at the last budget", title="L(N)")
    right.legend(fontsize=7)
    from matplotlib.ticker import FormatStrFormatter

    for ax in (left, right):  # losses as plain numbers on the log axis
        ax.yaxis.set_major_formatter(FormatStrFormatter("%.1f"))
        ax.yaxis.set_minor_formatter(FormatStrFormatter("%.1f"))
    fig.tight_layout()
    return save_png(fig, path)


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    stages = StageRunner(args.work)
    tokens = tokens_stage(stages, args)
    runs = [train_size(stages, tokens, size, args) for size in args.sizes.split(",")]
    vocab = len(Tokenizer.from_pretrained(tokens / "tokenizer"))
    for r in runs:
        print(f"{r['size']}: N {r['non_embedding_parameters']:,}, last loss "
              f"{r['final_loss']:.3f}, {r['train_seconds']:.0f} s", flush=True)
    result = {"runs": runs, "analysis": analyse(runs, unigram_loss(
        tokens / "shards", vocab, args.eval_batches * args.batch_size * args.seq_len)),
              "host": describe_host(args.threads),
              "threads": args.threads, "settings": {k: v for k, v in vars(args).items()},
              "stage_seconds": {  # as recorded when each stage ran (a cached one: then)
                  "tokens": json.loads((tokens / "DONE.json").read_text())["seconds"],
                  "pretraining": sum(r["stage_seconds"] or 0.0 for r in runs)},
              "this_invocation_seconds": time.perf_counter() - started}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "scaling.json", result)
    atomic_write_text(out / "scaling.md", markdown(result))
    plot(result, out / "scaling.png")
    print(markdown(result), flush=True)
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for scaling.json, .md, .png")
    p.add_argument("--work", default="runs/scaling", help="stage cache folder")
    p.add_argument("--corpus", help="a corpus folder (`lmlab data build`); default: build the "
                   "default corpus (every installed source less the tasks' dev/test texts)")
    p.add_argument("--sources", help="corpus sources when building (default: all)")
    p.add_argument("--max-documents", type=int, help="per source, when building (quick runs)")
    p.add_argument("--validation-fraction", type=float, default=0.01)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--sizes", default="1x32,2x48,3x64,3x96,4x128,4x192",
                   help="LAYERSxHIDDEN,... (at least 3)")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps of every size")
    p.add_argument("--evals", type=int, default=15, help="held-out evaluations per run")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--lr", type=float, help="peak LR (default: Kaplan's for each N)")
    p.add_argument("--warmup", type=float, default=0.05, help="fraction of the steps")
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    for name in ("vocab_size", "steps", "evals", "batch_size", "seq_len", "eval_batches",
                 "threads", "max_documents"):
        check_at_least(getattr(args, name), 1, f"--{name.replace('_', '-')}")
    sizes = args.sizes.split(",")
    [parse_size(s) for s in sizes]
    if len(set(sizes)) < 3:
        raise LmlabError(f"--sizes names {len(set(sizes))} sizes", "give at least 3 (a fit)")
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        run(parse_args(argv))
    except LmlabError as error:
        print(f"error: {error.problem}\nfix: {error.fix}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
