"""Translating held-out Bible verses from English to Spanish with a small Marian model (the
original Transformer, Vaswani et al. 2017, as OPUS-MT trains it), trained from scratch on one
CPU, scored by BLEU and chrF (sacrebleu), three seeds.

Pairs are the verses of the King James Bible and the Reina-Valera 1909 (SWORD modules) with at
most ``--max-words`` words on each side; 500 are held out for dev and 500 for test (seed 0),
the rest train. One unigram vocabulary (T5-style, cased, accents kept) is trained on both
sides of the training pairs. The floor is copying the English verse as the "translation" (names, numbers
and punctuation score a few BLEU points on their own).

    python scripts/crosslingual_translation.py                 # docs/crosslingual.md
    python scripts/crosslingual_translation.py --books Ruth,Jonah --steps 20 --seeds 0 \\
        --test 40 --dev 20 --out /tmp/translate                # a toy run

Each seed is ``lmlab seq2seq train`` and ``lmlab seq2seq evaluate`` (greedy and beam 4) on the
task folder the script writes (``OUT/data``); runs are reused by a rerun. Writes
``OUT/translation.json`` and ``OUT/translation.png`` and prints the Markdown table.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from lmlab.metrics.generation import bleu, chrf
from lmlab.text.sources.sword import bible_verses
from lmlab.tokenization.tokenizer import Tokenizer
from lmlab.utils.host import describe_host
from lmlab.utils.io import atomic_write_json, atomic_write_text

BEAMS = (1, 4)


def write_task(args: argparse.Namespace, data: Path) -> dict[str, int]:
    """The ``text`` task folder (train/dev/test.jsonl, task.json) of English -> Spanish."""
    books = args.books.split(",") if args.books else None
    english, spanish = bible_verses("engKJV2006eb", books), bible_verses("spaRV1909eb", books)
    references = sorted(r for r in english.keys() & spanish.keys()
                        if max(len(english[r].split()), len(spanish[r].split())) <= args.max_words)
    random.Random(0).shuffle(references)
    cut = {"test": references[:args.test], "dev": references[args.test:args.test + args.dev],
           "train": references[args.test + args.dev:]}
    data.mkdir(parents=True, exist_ok=True)
    for split, refs in cut.items():
        atomic_write_text(data / f"{split}.jsonl", "".join(json.dumps(
            {"input": english[r], "references": [spanish[r]], "key": r}, ensure_ascii=False)
            + "\n" for r in refs))
    atomic_write_json(data / "task.json", {"task": "text"})
    return {split: len(refs) for split, refs in cut.items()}


def lmlab(*argv: str) -> None:
    """Run one lmlab command in a fresh process (its own output streams to ours)."""
    subprocess.run([sys.executable, "-m", "lmlab", *argv], check=True)


def run_seed(args: argparse.Namespace, out: Path, tokenizer: Path, seed: int) -> dict:
    """Train and score one seed (reused when its metrics exist)."""
    run, metrics = out / f"seed-{seed}", out / f"seed-{seed}" / "test-metrics.json"
    if not metrics.exists():
        lmlab("seq2seq", "train", "--data", str(out / "data"), "--family", "marian",
              "--layers", str(args.layers), "--hidden", str(args.hidden), "--tokenizer",
              str(tokenizer), "--steps", str(args.steps), "--batch-size", str(args.batch_size),
              "--lr", str(args.lr), "--seed", str(seed), "--label-smoothing", "0.1",
              "--max-source-length", "128", "--max-target-length", "128", "--out", str(run),
              *(["--threads", str(args.threads)] if args.threads else []))
        lmlab("seq2seq", "evaluate", "--model", str(run / "model"), "--data",
              str(out / "data"), "--beams", ",".join(map(str, BEAMS)), "--max-new-tokens",
              "128", "--out", str(metrics), *(["--threads", str(args.threads)]
                                                if args.threads else []))
    return json.loads(metrics.read_text())


def copy_floor(data: Path) -> dict[str, float]:
    """BLEU and chrF of the English verse itself as the Spanish hypothesis."""
    rows = [json.loads(line) for line in (data / "test.jsonl").read_text().splitlines()]
    sources, references = [r["input"] for r in rows], [r["references"] for r in rows]
    return {"bleu": 100 * bleu(sources, references), "chrf": 100 * chrf(sources, references)}


def beam_scores(metrics: dict, beams: int) -> dict[str, float]:
    """BLEU and chrF of one beam size in an evaluate metrics file."""
    entry = metrics[f"beam {beams}"]
    return {"bleu": 100 * entry["bleu"], "chrf": 100 * entry["chrf"]}  # sacrebleu's scale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/crosslingual-translation")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--books", default="", help="OSIS names (default: the whole Bible)")
    parser.add_argument("--max-words", type=int, default=40)
    parser.add_argument("--dev", type=int, default=500)
    parser.add_argument("--test", type=int, default=500)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    out, started = Path(args.out), time.perf_counter()
    data = out / "data"
    sizes = write_task(args, data)
    tokenizer = out / "tokenizer"
    if not (tokenizer / "tokenizer.json").exists():
        rows = [json.loads(line) for line in (data / "train.jsonl").read_text().splitlines()]
        texts = [r["input"] for r in rows] + [r["references"][0] for r in rows]
        Tokenizer.train(iter(texts), kind="unigram", vocab_size=args.vocab_size, lowercase=False,
                        strip_accents=False).save_pretrained(tokenizer)
    seeds = [int(s) for s in args.seeds.split(",")]
    per_seed = {seed: {b: beam_scores(run_seed(args, out, tokenizer, seed), b) for b in BEAMS}
                for seed in seeds}
    floor = copy_floor(data)
    lines = ["| decoding | BLEU | chrF |", "|---|---:|---:|",
             f"| copy the English verse (floor) | {floor['bleu']:.1f} | {floor['chrf']:.1f} |"]
    for beams in BEAMS:
        cells = []
        for metric in ("bleu", "chrf"):
            values = [per_seed[s][beams][metric] for s in seeds]
            cells.append(f"{statistics.median(values):.1f}" + (
                f" ({min(values):.1f}-{max(values):.1f})" if len(values) > 1 else ""))
        lines.append(f"| {'greedy' if beams == 1 else f'beam {beams}'} | " + " | ".join(cells)
                     + " |")
    minutes = (time.perf_counter() - started) / 60
    atomic_write_json(out / "translation.json", {
        "settings": vars(args), "sizes": sizes, "per_seed": per_seed, "copy_floor": floor,
        "host": describe_host(), "minutes": round(minutes, 1)})
    plot(per_seed, floor, out / "translation.png")
    print(json.dumps(sizes))
    print("\n".join(lines))
    return 0


def plot(per_seed: dict, floor: dict[str, float], path: Path) -> None:
    """BLEU and chrF per decoding, each seed a dot, the copy floor a dashed line."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(7, 3))
    for axis, metric in zip(axes, ("bleu", "chrf")):
        for i, beams in enumerate(BEAMS):
            values = [scores[beams][metric] for scores in per_seed.values()]
            axis.bar(i, statistics.median(values), color="#468")
            axis.plot([i] * len(values), values, "k.")
        axis.axhline(floor[metric], color="gray", linestyle="--", label="copy English")
        axis.set_xticks(range(len(BEAMS)), ["greedy" if b == 1 else f"beam {b}" for b in BEAMS])
        axis.set_title(f"{metric.upper() if metric == 'bleu' else 'chrF'} (test verses)")
    axes[0].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


if __name__ == "__main__":
    raise SystemExit(main())
