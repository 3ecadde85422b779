"""ALBERT's Figure 1 (Lan et al. 2020): the L2 distance and the angle (cosine similarity in
degrees) between each layer's input and output embeddings, BERT against ALBERT of the same width.

By default both models are pretrained here for the same tokens (the same corpus, WordPiece
vocabulary, masked-LM objective, steps, batch, sequence length, learning rate and seed; ALBERT
with its factorised embeddings and one shared layer), then measured on WordNet's example
sentences (lmlab.analysis.layer_transitions). ``--models A B`` measures two given models instead.

    python scripts/albert_figure1.py --steps 600 --out docs-figure1/
    python scripts/albert_figure1.py --models runs/bert/model runs/albert/model --out fig1/

Stages are cached under ``--work`` (a finished pretraining is reused, an interrupted one
resumes). Writes ``figure1.json``, ``figure1.md`` and ``figure1.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from lmlab.analysis.attention import default_sample
from lmlab.analysis.layer_transitions import (
    check_same_width,
    layer_transitions,
    plot_transitions,
    to_markdown,
)
from lmlab.analysis.report import write_files
from lmlab.data.build import build_corpus
from lmlab.data.shards import build_shards
from lmlab.demo.stages import StageRunner
from lmlab.load import load_model_and_tokenizer
from lmlab.tokenization.tokenizer import Tokenizer
from lmlab.training.pretrain import PretrainConfig, pretrain
from lmlab.utils.checks import check_at_least, parse_int_list
from lmlab.utils.host import describe_host

FAMILIES = ("bert", "albert")


def model_args(args: argparse.Namespace, family: str) -> dict[str, Any]:
    """The same stack for both; ALBERT adds its embedding size (the layer is shared by its
    family's shape)."""
    shape = {"hidden_size": args.hidden, "num_hidden_layers": args.layers,
             "num_attention_heads": args.heads, "intermediate_size": 4 * args.hidden}
    return {**shape, "embedding_size": args.embedding_size} if family == "albert" else shape


def pretrained_models(args: argparse.Namespace) -> list[tuple[str, Path]]:
    """Corpus, a WordPiece vocabulary, shards, then BERT and ALBERT on the same tokens."""
    stages = StageRunner(args.work)
    sources = args.sources.split(",")

    def corpus(folder: Path) -> dict[str, Any]:
        manifest = build_corpus(sources, folder / "corpus", exclude_tasks=(),
                                max_documents=args.max_documents, validation_fraction=0.05)
        return {"words": manifest["total_words"]}

    corpus_folder, corpus_info = stages.run(
        "corpus", {"sources": sources, "max_documents": args.max_documents}, corpus)

    def tokens(folder: Path) -> dict[str, Any]:
        tokenizer = Tokenizer.train(corpus_folder / "corpus", kind="wordpiece",
                                    vocab_size=args.vocab_size, show_progress=False)
        tokenizer.save_pretrained(folder / "tokenizer")
        build_shards(tokenizer, corpus_folder / "corpus", folder / "shards", show_progress=False)
        return {"vocab_size": len(tokenizer)}

    token_folder, _ = stages.run("tokens", {"corpus": corpus_info, "vocab": args.vocab_size},
                                 tokens)
    models = []
    seeds = args.seeds
    for seed, family in ((seed, family) for seed in seeds for family in FAMILIES):
        settings = {"family": family, "size": "base", "model_args": model_args(args, family),
                    "objective": "mlm", "seq_len": args.seq_len, "batch_size": args.batch_size,
                    "lr": args.lr, "warmup_fraction": 0.06, "schedule": "linear",
                    "max_steps": args.steps, "seed": seed}

        def train(folder: Path, settings: dict[str, Any] = settings) -> dict[str, Any]:
            result = pretrain(PretrainConfig.from_sections(
                None, out=folder / "run", shards=token_folder / "shards",
                tokenizer=str(token_folder / "tokenizer"), threads=args.threads,
                precision="fp32", eval_every=max(args.steps // 4, 1), eval_batches=4,
                save_every=max(args.steps // 4, 1), **settings))
            return {"steps": result.step, "tokens": result.tokens,
                    "eval_loss": (result.last_eval or {}).get("eval_loss")}

        folder, info = stages.run(f"pretrain-{family}",
                                  {"tokens": token_folder.name, **settings}, train,
                                  resumable=True)
        name = family if len(seeds) == 1 else f"{family} seed {seed}"
        print(f"{name}: {info}", flush=True)
        models.append((name, folder / "run" / "model"))
    return models


def measure(models: list[tuple[str, Path]], args: argparse.Namespace) -> dict[str, Any]:
    """Both models' transitions on the same sentences, the table, the figure and the JSON."""
    loaded = [(name, *load_model_and_tokenizer(path)) for name, path in models]
    check_same_width({name: model.config.hidden_size for name, model, _ in loaded})
    texts = default_sample(args.sample)
    started = time.perf_counter()
    results = [layer_transitions(model, tokenizer, texts, name=name)
               for name, model, tokenizer in loaded]
    summary = {"host": describe_host(), "seconds": round(time.perf_counter() - started, 1),
               "sample": f"{len(texts)} WordNet example sentences",
               "models": {name: str(path) for name, path in models},
               "results": [r.to_json() for r in results]}
    table = to_markdown(results)
    write_files(args.out, {"figure1.json": summary, "figure1.md": table,
                           "figure1.png": lambda path: plot_transitions(results, path)})
    print(table, end="")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs=2, metavar=("A", "B"),
                        help="measure these two model folders (or runs) instead of pretraining")
    parser.add_argument("--work", default="runs/albert-figure1", help="stage cache folder")
    parser.add_argument("--out", default="albert-figure1", help="folder for figure1.*")
    parser.add_argument("--sources", default="kjv,wordnet", help="corpus sources")
    parser.add_argument("--max-documents", type=int, default=None)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--embedding-size", type=int, default=128, help="ALBERT's E")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--seeds", default="0",
                        help="pretraining seeds, e.g. 0,1,2: a BERT and an ALBERT for each")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sample", type=int, default=500, help="WordNet sentences to measure on")
    args = parser.parse_args(argv)
    for name in ("vocab_size", "hidden", "layers", "heads", "embedding_size", "steps",
                 "batch_size", "seq_len", "threads", "sample"):
        check_at_least(getattr(args, name), 1, f"--{name.replace('_', '-')}")
    args.seeds = parse_int_list(args.seeds, "--seeds")
    check_at_least(min(args.seeds), 0, "--seeds")
    models = ([(m, Path(m)) for m in args.models] if args.models
              else pretrained_models(args))
    measure(models, args)
    print(f"wrote figure1.json, figure1.md and figure1.png to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
