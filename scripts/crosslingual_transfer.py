"""Zero-shot cross-lingual transfer (Pires et al. 2019; Conneau et al. 2020) at the scale of one
CPU: a masked LM pretrained on English and Spanish together (one shared WordPiece vocabulary),
fine-tuned on English verses' labels only, scored on Spanish verses.

The data is the King James Bible and the Reina-Valera 1909 (SWORD modules, verse-aligned). A
verse's label is its part of the Bible (law, history, wisdom, prophets, gospels, letters: the
book groups below). Verses are drawn once (seed 0) into an English training set, an English dev
set (model selection sees English only) and a test set of other verses in Spanish. Rows:

- ``pretrained``: the joint masked LM fine-tuned on English, tested on Spanish (zero-shot);
- ``random init``: the same architecture from random weights, the same fine-tuning;
- ``TF-IDF``: TF-IDF + logistic regression on the English words, tested on Spanish;
- ``pretrained, Spanish labels``: fine-tuned on the Spanish translations of the training
  verses (the ceiling transfer aims at).

The pretraining recipe is the demo's (a 2-layer RoFormer of BERT-mini's width, masked LM at
40%, batch 8, learning rate 1e-3; docs/demo.md) for a fixed number of steps, so every host
trains the same model. Stages are cached under ``--out``; a rerun reuses what finished.

    python scripts/crosslingual_transfer.py                     # docs/crosslingual.md
    python scripts/crosslingual_transfer.py --books Matt,Rom,Gen,Ps --pretrain-steps 50 \\
        --train 200 --dev 60 --test 60 --seeds 0 --out /tmp/transfer   # a toy run
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

from lmlab.data.build import build_corpus
from lmlab.data.shards import build_shards
from lmlab.demo.job import DemoConfig
from lmlab.demo.stages import StageRunner
from lmlab.finetune.runner import finetune
from lmlab.tasks.baseline import run_tfidf_baseline
from lmlab.tasks.loader import load_task
from lmlab.text.sources.sword import bible_verses
from lmlab.tokenization.tokenizer import Tokenizer
from lmlab.training.pretrain import PretrainConfig, pretrain
from lmlab.utils.host import describe_host
from lmlab.utils.io import atomic_write_json, atomic_write_text

MODULES = {"eng": "engKJV2006eb", "spa": "spaRV1909eb"}
GROUPS = {  # OSIS book names by part of the Bible
    "law": "Gen Exod Lev Num Deut",
    "history": "Josh Judg Ruth 1Sam 2Sam 1Kgs 2Kgs 1Chr 2Chr Ezra Neh Esth",
    "wisdom": "Job Ps Prov Eccl Song",
    "prophets": "Isa Jer Lam Ezek Dan Hos Joel Amos Obad Jonah Mic Nah Hab Zeph Hag Zech Mal",
    "gospels": "Matt Mark Luke John",
    "letters": "Acts Rom 1Cor 2Cor Gal Eph Phil Col 1Thess 2Thess 1Tim 2Tim Titus Phlm Heb Jas "
               "1Pet 2Pet 1John 2John 3John Jude Rev",
}
GROUP_OF = {book: group for group, books in GROUPS.items() for book in books.split()}


def task_files(args: argparse.Namespace, folder: Path) -> dict[str, Path]:
    """JSONL files of the verse task: English train/dev, Spanish train/dev (the same verses),
    Spanish and English test (the same held-out verses)."""
    books = args.books.split(",") if args.books else None
    verses = {lang: bible_verses(module, books) for lang, module in MODULES.items()}
    references = sorted(verses["eng"].keys() & verses["spa"].keys())
    random.Random(0).shuffle(references)
    cut = {"train": references[:args.train],
           "dev": references[args.train:args.train + args.dev],
           "test": references[args.train + args.dev:args.train + args.dev + args.test]}
    files = {}
    for lang in MODULES:
        for split, refs in cut.items():
            files[f"{lang}-{split}"] = folder / f"{lang}-{split}.jsonl"
            atomic_write_text(files[f"{lang}-{split}"], "".join(
                json.dumps({"text": verses[lang][r], "label": GROUP_OF[r.split(".")[0]],
                            "id": r}, ensure_ascii=False) + "\n" for r in refs))
    return files


def majority_share(path: Path) -> float:
    """The share of the most frequent label in a JSONL task file (the chance row)."""
    labels = [json.loads(line)["label"] for line in path.read_text().splitlines()]
    return max(labels.count(label) for label in set(labels)) / len(labels)


def pretrained_model(args: argparse.Namespace, stages: StageRunner) -> Path:
    """Corpus (both Bibles), a shared WordPiece vocabulary, shards, the masked LM."""
    demo = DemoConfig()
    sources = [f"sword:{m}" + (f":{args.books}" if args.books else "") for m in MODULES.values()]

    def corpus(folder: Path) -> dict[str, Any]:
        manifest = build_corpus(sources, folder / "corpus", exclude_tasks=())
        return {"words": manifest["total_words"]}

    corpus_folder, corpus_info = stages.run("corpus", {"sources": sources}, corpus)

    def tokens(folder: Path) -> dict[str, Any]:
        tokenizer = Tokenizer.train(corpus_folder / "corpus", kind="wordpiece",
                                    vocab_size=args.vocab_size, show_progress=False)
        tokenizer.save_pretrained(folder / "tokenizer")
        build_shards(tokenizer, corpus_folder / "corpus", folder / "shards")
        return {"vocab_size": len(tokenizer)}

    token_folder, _ = stages.run("tokens", {"corpus": corpus_info, "vocab": args.vocab_size},
                                 tokens)
    inputs = {"tokens": token_folder.name, "steps": args.pretrain_steps, "family": demo.family,
              "size": demo.size, "lr": demo.pretrain_lr, "batch": demo.batch_size,
              "mask_prob": demo.mask_prob, "model_args": demo.model_args}

    def train(folder: Path) -> dict[str, Any]:
        result = pretrain(PretrainConfig.from_sections(
            None, out=folder / "run", lr=demo.pretrain_lr, warmup_fraction=demo.pretrain_warmup,
            schedule=demo.pretrain_schedule, seq_len=demo.seq_len, batch_size=demo.batch_size,
            max_steps=args.pretrain_steps, seed=0, eval_every=max(args.pretrain_steps // 8, 1),
            save_every=max(args.pretrain_steps // 8, 1), threads=args.threads,
            precision="fp32", family=demo.family, size=demo.size,
            model_args=dict(demo.model_args), objective=demo.objective,
            objective_args=demo.objective_args(), shards=token_folder / "shards",
            tokenizer=str(token_folder / "tokenizer")))
        return {"steps": result.step, "tokens": result.tokens}

    folder, _ = stages.run("pretrain", inputs, train, resumable=True)
    return folder / "run"


def run_rows(args: argparse.Namespace, stages: StageRunner, files: dict[str, Path],
             model: Path) -> dict[str, list[dict[str, float]]]:
    """Every row's dev and test accuracy per seed."""
    english = load_task("verses-en-to-es", train=files["eng-train"], dev=files["eng-dev"],
                        test=files["spa-test"], task_type="classification")
    spanish = load_task("verses-es", train=files["spa-train"], dev=files["spa-dev"],
                        test=files["spa-test"], task_type="classification")
    in_english = load_task("verses-en", train=files["eng-train"], dev=files["eng-dev"],
                           test=files["eng-test"], task_type="classification")
    demo = DemoConfig()
    rows: dict[str, list[dict[str, float]]] = {}
    plans = [("pretrained", english, False), ("random init", english, True),
             ("pretrained, Spanish labels", spanish, False)]
    for seed in [int(s) for s in args.seeds.split(",")]:
        for name, task, random_init in plans:
            def work(folder: Path, task=task, random_init=random_init, seed=seed):
                result = finetune(task, model, folder / "run", seed=seed, recipe="bert",
                                  epochs=args.epochs, lr=demo.finetune_lr,
                                  batch_size=demo.finetune_batch_size,
                                  pooling=demo.finetune_pooling, random_init=random_init,
                                  save_model=False, show_progress=False, precision="fp32")
                return {"dev": result["dev"]["accuracy"], "test": result["test"]["accuracy"]}

            _, scores = stages.run(f"finetune-{name.replace(' ', '-').replace(',', '')}-{seed}",
                                   {"model": str(model), "task": task.name, "seed": seed,
                                    "epochs": args.epochs, "random": random_init}, work)
            rows.setdefault(name, []).append(scores)
    tfidf = run_tfidf_baseline(english)
    rows["TF-IDF"] = [{"dev": tfidf["dev"]["accuracy"], "test": tfidf["test"]["accuracy"]}]
    rows["TF-IDF, English test"] = [{"dev": tfidf["dev"]["accuracy"],
                                     "test": run_tfidf_baseline(in_english)["test"]["accuracy"]}]
    return rows


def markdown(rows: dict[str, list[dict[str, float]]], chance: float) -> str:
    lines = ["| row | English dev | Spanish test |", "|---|---:|---:|"]
    for name, runs in rows.items():
        cells = []
        for split in ("dev", "test"):
            values = [r[split] for r in runs]
            spread = f" ({min(values):.3f}-{max(values):.3f})" if len(values) > 1 else ""
            cells.append(f"{statistics.median(values):.3f}{spread}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append(f"| most frequent part | | {chance:.3f} |")
    return "\n".join(lines)


def plot(rows: dict[str, list[dict[str, float]]], path: Path) -> None:
    """Spanish test accuracy per row: the median as a bar, each seed as a dot."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 3.2))
    for i, (name, runs) in enumerate(rows.items()):
        values = [r["test"] for r in runs]
        axes.barh(i, statistics.median(values), color="#9ab" if "TF-IDF" in name else "#468")
        axes.plot(values, [i] * len(values), "k.", markersize=4)
    axes.set_yticks(range(len(rows)), list(rows))
    axes.invert_yaxis()
    axes.set_xlabel("test accuracy (Spanish verses; the last row English)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/crosslingual-transfer")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--books", default="", help="OSIS names (default: the whole Bible)")
    parser.add_argument("--train", type=int, default=4000)
    parser.add_argument("--dev", type=int, default=1000)
    parser.add_argument("--test", type=int, default=1000)
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--pretrain-steps", type=int, default=6000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    out = Path(args.out)
    started = time.perf_counter()
    stages = StageRunner(out)
    files = task_files(args, out)
    model = pretrained_model(args, stages)
    rows = run_rows(args, stages, files, model)
    minutes = (time.perf_counter() - started) / 60
    chance = majority_share(files["spa-test"])
    atomic_write_json(out / "transfer.json", {"settings": vars(args), "rows": rows,
                                              "most_frequent_part": chance,
                                              "host": describe_host(), "minutes": minutes})
    table = markdown(rows, chance)
    atomic_write_text(out / "transfer.md", table + "\n")
    print(table)
    plot(rows, out / "transfer.png")
    print(json.dumps({"minutes": round(minutes, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
