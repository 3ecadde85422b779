"""Generation that respects counts (Ficler & Goldberg 2017), at a one-CPU scale.

Examples are passages of 1-3 consecutive sentences of the default corpus; each is counted
(words in the paper's length buckets, sentences, commas: lmlab.data.controls) and prefixed with
its control tokens. Two small GPT-style decoders (Llama blocks, rotary positions) are pretrained
with lmlab's causal-LM objective for the same tokens: one on the prefixed examples, one on the
same examples behind a bare start token. Each is then sampled, N texts per requested setting
(the conditioned model gets the setting's prefix, the unconditioned one the start token), and
the samples are counted: the share that meets the requested counts, beside the training data's
base rate of that request (what a model that ignores it should score).

    python scripts/count_conditioned.py --corpus CORPUS_DIR --work /work/runs/count-conditioned \\
        --out docs/generation-control

Writes ``count_conditioned.json`` (settings, host, per-setting and per-bucket shares, example
samples, recorded seconds), ``count_conditioned.md`` (the tables) and ``count_conditioned.png``
into ``--out``. Stages (corpus, data, each pretraining, sampling) are cached under ``--work``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path
from typing import Any

from lmlab.data.build import build_corpus
from lmlab.data.controls import (
    PROPERTIES,
    START,
    ConditionedCorpus,
    check_properties,
    control_prefix,
    control_tokens,
    counts_of,
    joint_key,
    meets,
    write_conditioned_corpus,
)
from lmlab.data.shards import build_shards
from lmlab.demo.stages import StageLog, StageRunner
from lmlab.text.corpus import read_corpus
from lmlab.tokenization.tokenizer import Tokenizer
from lmlab.training.pretrain import PretrainConfig, pretrain
from lmlab.utils.checks import check_at_least
from lmlab.utils.errors import LmlabError
from lmlab.utils.host import describe_host

KINDS = ("conditioned", "unconditioned")
TOKENIZER_TEXTS = 200_000  # passages the BPE vocabulary is learnt from


def prepare_data(args: argparse.Namespace, stages: StageRunner) -> tuple[Path, ConditionedCorpus]:
    """The corpus (given or built), both example corpora, the tokenizer and both shard folders."""
    corpus = Path(args.corpus) if args.corpus else None
    if corpus is None:
        folder, _ = stages.run("corpus", {"sources": None}, lambda f: build_corpus(
            None, f / "corpus", show_progress=False)["total_words"])
        corpus = folder / "corpus"

    def work(folder: Path) -> dict[str, Any]:
        made = write_conditioned_corpus(corpus, {k: folder / k for k in KINDS}, args.properties,
                                        args.max_sentences, args.max_words, args.max_examples)
        texts = (d.sentences[0][len(START):] for d in itertools.islice(
            read_corpus(folder / "unconditioned"), TOKENIZER_TEXTS))
        tokenizer = Tokenizer.train(texts, kind="bpe", vocab_size=args.vocab_size,
                                    template="gpt2", special_tokens=[
                                        "<|endoftext|>", *control_tokens(args.properties)])
        tokenizer.save_pretrained(folder / "tokenizer")
        tokens = {kind: build_shards(tokenizer, folder / kind, folder / f"shards-{kind}",
                                     show_progress=False)["splits"]["train"]["num_tokens"]
                  for kind in KINDS}
        return {"examples": made.examples, "buckets": made.buckets, "joint": made.joint,
                "train_tokens": tokens}

    folder, info = stages.run("data", {
        "corpus": str(corpus.resolve()), "properties": args.properties,
        "max_sentences": args.max_sentences, "max_words": args.max_words,
        "max_examples": args.max_examples, "vocab": args.vocab_size}, work)
    return folder, ConditionedCorpus(info["examples"], info["buckets"], info["joint"])


def train(args: argparse.Namespace, stages: StageRunner, data: Path, kind: str) -> dict[str, Any]:
    """One decoder pretrained on ``kind``'s shards; the same budget for both kinds."""
    settings = {"family": "llama", "size": args.size, "objective": "clm",
                "objective_args": {"separate_documents": True}, "seq_len": args.seq_len,
                "batch_size": args.batch_size, "lr": args.lr, "warmup_fraction": 0.05,
                "schedule": "cosine", "max_steps": args.steps, "seed": args.seed}

    def work(folder: Path) -> dict[str, Any]:
        every = max(args.steps // 4, 1)
        result = pretrain(PretrainConfig.from_sections(
            None, out=folder / "run", shards=data / f"shards-{kind}",
            tokenizer=str(data / "tokenizer"), threads=args.threads, precision="fp32",
            eval_every=every, eval_batches=8, save_every=every, progress=False, **settings))
        return {"steps": result.step, "tokens": result.tokens,
                "eval_loss": (result.last_eval or {}).get("eval_loss")}

    folder, info = stages.run(f"pretrain-{kind}", {"data": data.name, **settings}, work,
                              resumable=True)
    print(f"pretrained {kind}: {info}", flush=True)
    return {**info, "model": str(folder / "run" / "model")}


def sample(args: argparse.Namespace, model_dir: str, prompts: list[str],
           per_prompt: int) -> list[dict[str, Any]]:
    """``per_prompt`` sampled continuations of each prompt, in batches of at most
    ``args.samples``: text, counts, whether it ended."""
    import torch

    from lmlab.generation.generate import generate
    from lmlab.load import load_model_and_tokenizer

    torch.set_num_threads(args.threads)
    model, tokenizer = load_model_and_tokenizer(model_dir)
    eos = tokenizer.eos_token_id
    generator = torch.Generator().manual_seed(args.seed)
    out = []
    batches = [(p, min(args.samples, per_prompt - i)) for p in prompts
               for i in range(0, per_prompt, args.samples)]
    for prompt, count in batches:
        ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)] * count)
        with torch.no_grad():
            rows = generate(model, ids, do_sample=True, temperature=args.temperature,
                            max_new_tokens=args.max_new_tokens, eos_token_id=eos,
                            pad_token_id=eos, generator=generator)[:, ids.shape[1]:].tolist()
        for row in rows:
            ended = eos in row
            text = tokenizer.decode(row[:row.index(eos)] if ended else row,
                                    skip_special_tokens=True).strip()
            out.append({"prompt": prompt, "text": text, "ended": ended,
                        "counts": counts_of(text, args.properties)})
    return out


def requested_settings(args: argparse.Namespace, corpus: ConditionedCorpus) -> list[dict]:
    """Every combination of buckets holding at least ``--min-share`` of the training examples."""
    grid = itertools.product(*(PROPERTIES[n].labels for n in args.properties))
    settings = [dict(zip(args.properties, labels)) for labels in grid]
    kept = [s for s in settings if corpus.base_rate(s) >= args.min_share]
    if not kept:
        raise LmlabError(f"no combination holds {args.min_share:.2%} of the training examples",
                         "lower --min-share")
    return kept


def score(settings: list[dict], conditioned: list[dict], unconditioned: list[dict],
          corpus: ConditionedCorpus, names: list[str]) -> dict[str, Any]:
    """Per setting and per bucket: the conditioned samples' share meeting the request, the
    unconditioned samples' share meeting it and the training base rate."""
    for row in unconditioned:
        row["buckets"] = {n: PROPERTIES[n].bucket(row["counts"][n]) for n in names}
    per_setting = []
    for setting in settings:
        mine = [r for r in conditioned if r["prompt"] == control_prefix(setting)]
        hits = [meets(r["text"], setting) for r in mine]
        per_setting.append({
            "setting": joint_key(setting), "n": len(mine),
            "conditioned": sum(all(h.values()) for h in hits) / len(mine),
            **{f"conditioned_{n}": sum(h[n] for h in hits) / len(mine) for n in names},
            "unconditioned": sum(all(r["buckets"][n] == setting[n] for n in names)
                                 for r in unconditioned) / len(unconditioned),
            "base_rate": corpus.base_rate(setting)})
    per_bucket = []
    for name in names:
        for label in PROPERTIES[name].labels:
            rows = [s for s, setting in zip(per_setting, settings) if setting[name] == label]
            if not rows:
                continue
            n = sum(r["n"] for r in rows)
            per_bucket.append({
                "property": name, "bucket": label, "n": n,
                "conditioned": sum(r[f"conditioned_{name}"] * r["n"] for r in rows) / n,
                "unconditioned": sum(r["buckets"][name] == label for r in unconditioned)
                / len(unconditioned),
                "base_rate": corpus.base_rate({name: label})})
    overall = {key: sum(r[key] for r in per_setting) / len(per_setting)
               for key in ("conditioned", "unconditioned", "base_rate")}
    return {"per_setting": per_setting, "per_bucket": per_bucket, "overall": overall,
            "ended": {"conditioned": sum(r["ended"] for r in conditioned) / len(conditioned),
                      "unconditioned": sum(r["ended"] for r in unconditioned)
                      / len(unconditioned)}}


def markdown(scores: dict[str, Any], head: str) -> str:
    lines = [head, "", "Share of samples whose counts fall in the requested bucket (per "
             "property, over every requested setting that asks for that bucket):", "",
             "| property | requested | samples | conditioned | unconditioned | base rate |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['property']} | {r['bucket']} | {r['n']} | {r['conditioned']:.2f} | "
              f"{r['unconditioned']:.2f} | {r['base_rate']:.2f} |" for r in scores["per_bucket"]]
    o = scores["overall"]
    lines += ["", f"All requested counts at once, mean over {len(scores['per_setting'])} "
              f"settings: conditioned **{o['conditioned']:.3f}**, unconditioned "
              f"{o['unconditioned']:.3f}, base rate {o['base_rate']:.3f}. Samples that ended "
              f"(end of text before the token limit): conditioned "
              f"{scores['ended']['conditioned']:.3f}, unconditioned "
              f"{scores['ended']['unconditioned']:.3f}.", "",
              "| setting | samples | conditioned (all) | unconditioned (all) | base rate |",
              "|---|---|---|---|---|"]
    lines += [f"| {r['setting']} | {r['n']} | {r['conditioned']:.2f} | {r['unconditioned']:.2f}"
              f" | {r['base_rate']:.3f} |" for r in scores["per_setting"]]
    return "\n".join(lines) + "\n"


def plot(scores: dict[str, Any]):
    def draw(path: Path) -> None:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = scores["per_bucket"]
        labels = [f"{r['property']}\n{r['bucket']}" for r in rows] + ["all\n(joint)"]
        o = scores["overall"]
        fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(labels)), 3.8))
        width = 0.27
        for i, (key, name) in enumerate((("base_rate", "training base rate"),
                                         ("unconditioned", "unconditioned model"),
                                         ("conditioned", "conditioned model"))):
            values = [r[key] for r in rows] + [o[key]]
            ax.bar([x + (i - 1) * width for x in range(len(labels))], values, width, label=name)
        ax.set_xticks(range(len(labels)), labels, fontsize=7)
        ax.set_ylabel("share of samples meeting the request")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7)
        ax.set_title("Count-conditioned generation (Ficler & Goldberg 2017)", fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
    return draw


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for the JSON, Markdown and PNG")
    p.add_argument("--work", default="runs/count-conditioned", help="stage cache folder")
    p.add_argument("--corpus", help="an lmlab corpus folder (default: build the default one)")
    p.add_argument("--properties", default="words,sentences,commas")
    p.add_argument("--max-sentences", type=int, default=3, help="sentences per example, 1..N")
    p.add_argument("--max-words", type=int, default=100, help="longer passages are skipped")
    p.add_argument("--max-examples", type=int, help="the first N training examples (toy runs)")
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--size", default="2x128", help="a llama preset: 2x128, 4x256, ...")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--samples", type=int, default=40, help="per requested setting")
    p.add_argument("--min-share", type=float, default=0.005,
                   help="request the bucket combinations at least this common in training")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    args.properties = check_properties([n.strip() for n in args.properties.split(",")])
    for name in ("max_sentences", "max_words", "max_examples", "vocab_size", "steps",
                 "batch_size", "seq_len", "samples", "max_new_tokens", "threads"):
        check_at_least(getattr(args, name), 1, f"--{name.replace('_', '-')}")
    if not 0 <= args.min_share < 1:
        raise LmlabError(f"--min-share {args.min_share} is outside [0, 1)", "use e.g. 0.005")
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    from lmlab.analysis.report import write_files

    log = StageLog()
    stages = StageRunner(args.work, log=log)
    data, corpus = prepare_data(args, stages)
    models = {kind: train(args, stages, data, kind) for kind in KINDS}
    settings = requested_settings(args, corpus)
    prompts = [control_prefix(s) for s in settings]

    def work(folder: Path) -> dict[str, Any]:
        conditioned = sample(args, models["conditioned"]["model"], prompts, args.samples)
        # as many unconditioned samples, all from the start token
        unconditioned = sample(args, models["unconditioned"]["model"], [START],
                               args.samples * len(settings))
        return {"conditioned": conditioned, "unconditioned": unconditioned}

    _, samples = stages.run("samples", {"models": [m["model"] for m in models.values()],
                                        "prompts": prompts, "samples": args.samples,
                                        "temperature": args.temperature, "seed": args.seed,
                                        "max_new_tokens": args.max_new_tokens}, work)
    scores = score(settings, samples["conditioned"], samples["unconditioned"], corpus,
                   args.properties)
    host = describe_host(args.threads)
    seconds = log.recorded_seconds()
    tokens = args.steps * args.batch_size * args.seq_len
    head = (f"Host: {host}. Two llama-{args.size} decoders, {args.steps} steps x "
            f"{args.batch_size} x {args.seq_len} = {tokens:,} tokens each, on "
            f"{corpus.examples['train']:,} training examples; {args.samples} samples per "
            f"setting at temperature {args.temperature}; {seconds / 60:.1f} min recorded.")
    examples = {s["setting"]: [r["text"] for r in samples["conditioned"]
                               if r["prompt"] == control_prefix(setting)][:2]
                for s, setting in zip(scores["per_setting"], settings)}
    result = {"host": host, "settings": {k: v for k, v in vars(args).items()},
              "models": models, "examples": corpus.examples, "base_buckets": corpus.buckets,
              "recorded_seconds": round(seconds, 1), "stages": log.entries, **scores,
              "sample_texts": examples,
              "unconditioned_texts": [r["text"] for r in samples["unconditioned"][:6]]}
    write_files(args.out, {"count_conditioned.json": result,
                           "count_conditioned.md": markdown(scores, head),
                           "count_conditioned.png": plot(scores)})
    print(markdown(scores, head), end="")
    return result


def main(argv: list[str] | None = None) -> int:
    try:
        run(parse_args(argv))
    except LmlabError as error:
        print(f"error: {error.problem}\nfix: {error.fix}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
