"""``lmlab sentence pairs|train|evaluate``: sentence encoders (Sentence-BERT, skip-thought,
quick-thought) and their evaluation (docs/sentence-encoders.md)."""

from __future__ import annotations

import argparse
import json

from lmlab.cli import _common


def register(commands) -> None:
    p = commands.command(
        "pairs", help="write WordNet (example sentence, gloss) pairs, split by synset",
        example="lmlab sentence pairs --out pairs", handler=_pairs, group="sentence")
    _common.add_out(p, "folder for train/dev/test.jsonl and info.json",
                    overwrite="write into a non-empty --out")

    p = commands.command(
        "train", help="train a sentence encoder: mnrl, softmax, cosine or triplet on pairs, skip-thought or "
                      "quick-thought on a corpus",
        example="lmlab sentence train --objective mnrl --data pairs --init minilm --steps 100 "
                "--out runs/sbert", handler=_train, group="sentence")
    p.add_argument("--objective", required=True,
                   choices=("mnrl", "softmax", "cosine", "triplet", "skip-thought",
                            "quick-thought"))
    p.add_argument("--data", required=True,
                   help="a pair folder (`lmlab sentence pairs`) or JSON-lines pair file for "
                        "mnrl/softmax/cosine/triplet; an lmlab corpus folder for skip-thought/quick-thought")
    _common.add_out(p, "run folder (model/, metrics, checkpoints)")
    p.add_argument("--init", help="start from this encoder (folder or short name: minilm)")
    p.add_argument("--size", default="tiny", help="bert preset of a fresh encoder (no --init)")
    p.add_argument("--tokenizer", help="tokenizer of a fresh encoder (default: minilm's)")
    _common.add_flags(p, "steps", "budget", "seed", "threads", "device", batch_size=32, lr=2e-5,
                      warmup=0.1)
    _common.add_flag(p, "max_length", default=128, help="tokens per sentence")
    _common.add_flag(p, "precision", default="fp32", choices=("fp32", "bf16", "auto"))
    p.add_argument("--max-sentences", type=int, help="corpus sentences read at most")
    p.add_argument("--scale", type=float, default=20.0, help="mnrl: cosine scale")
    p.add_argument("--num-labels", type=int, help="softmax: classes (default: from the pairs)")
    p.add_argument("--margin", type=float, default=5.0, help="triplet: margin (SBERT's 5)")
    p.add_argument("--distance", default="euclidean", choices=("euclidean", "cosine", "manhattan"),
                   help="triplet: distance")
    p.add_argument("--decoder-hidden", type=int, default=256, help="skip-thought: GRU size")
    _common.add_overwrite(p, "replace an existing run in --out")

    p = commands.command(
        "evaluate", help="Lee document similarity, WiC (cosine threshold) and gloss retrieval",
        example="lmlab sentence evaluate minilm --tasks lee,wic,retrieval",
        handler=_evaluate, group="sentence")
    p.add_argument("model", help="model folder, run directory or short name (minilm)")
    p.add_argument("--concat", metavar="FOLDER",
                   help="a second encoder on the same tokenizer whose vectors are put beside "
                        "the model's: quick-thought's [f(s); g(s)] with RUN/context_model")
    p.add_argument("--tasks", default="lee,wic,retrieval",
                   help="comma-separated: lee, wic, retrieval")
    p.add_argument("--lee-dir", help="folder with lee.cor and similarities0-1.txt (default: "
                                     "gensim's installed test data)")
    p.add_argument("--pairs", help="pair folder whose test split is the retrieval set "
                                   "(default: built from WordNet)")
    p.add_argument("--max-synsets", type=int, default=1000,
                   help="held-out synsets whose glosses are retrieved from")
    _common.add_out(p, "write the results (JSON) here", required=False,
                    overwrite="replace an existing --out file")
    _common.add_flags(p, "threads")


def _pairs(args: argparse.Namespace) -> int:
    from lmlab.sentence.pairs import build_wordnet_pairs, write_pairs
    from lmlab.utils.checks import check_output_folder

    check_output_folder(args.out, args.overwrite, "pair folder")
    pairs, info = build_wordnet_pairs()
    write_pairs(args.out, pairs, info, overwrite=True)
    print(json.dumps(info, indent=2))
    return 0


def _train(args: argparse.Namespace) -> int:
    from lmlab.cli._training_config import print_trained, training_config
    from lmlab.sentence.train import train_sentence_encoder

    cfg = training_config(args, ("batch_size", "steps", "threads", "max_length", "max_sentences",
                                 "num_labels", "decoder_hidden"),
                          "--steps 1000 or --budget 10m")
    result = train_sentence_encoder(
        args.objective, args.data, args.out, cfg, init=args.init, size=args.size,
        tokenizer=args.tokenizer, max_length=args.max_length, max_sentences=args.max_sentences,
        scale=args.scale, num_labels=args.num_labels, decoder_hidden=args.decoder_hidden,
        margin=args.margin, distance=args.distance, overwrite=args.overwrite)
    print_trained(result, args.out)
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    import torch

    from lmlab.sentence.encoder import ConcatenatedEncoder, SentenceEncoder
    from lmlab.sentence.evaluate import EVALUATIONS, evaluate_encoder, lee_folder
    from lmlab.utils.checks import check_at_least, check_names, check_output_file
    from lmlab.utils.io import atomic_write_json

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    check_names(tasks, EVALUATIONS, "--tasks", "evaluation")
    check_at_least(args.max_synsets, 2, "--max-synsets")
    check_at_least(args.threads, 1, "--threads")
    if args.out:
        check_output_file(args.out, args.overwrite)
    if "lee" in tasks:
        lee_folder(args.lee_dir)
    if args.threads:
        torch.set_num_threads(args.threads)
    encoder = (ConcatenatedEncoder.load([args.model, args.concat]) if args.concat
               else SentenceEncoder.load(args.model))
    results = evaluate_encoder(encoder, tasks, args.lee_dir, args.pairs, args.max_synsets)
    results = {"model": args.model, **({"concat": args.concat} if args.concat else {}),
               **results}
    if args.out:
        atomic_write_json(args.out, results)
    print(json.dumps(results, indent=2))
    return 0
