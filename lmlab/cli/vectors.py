"""``lmlab vectors``: static word vectors — train (word2vec, GloVe), evaluate, convert between
formats, align spaces."""

from __future__ import annotations

import argparse

from lmlab.cli import _common

SOURCE_HELP = "a word2vec (.txt, .bin) or GloVe (.txt) file, or glove-6b-50d"


def register(commands) -> None:
    p = commands.command(
        "train", help="train word2vec (skip-gram, CBOW) or GloVe vectors on an lmlab corpus or "
                      "text files, streamed",
        example="lmlab vectors train --method skipgram --corpus corpus/ --out vectors.bin",
        handler=_train, group="vectors")
    p.add_argument("--method", default="skipgram", choices=("skipgram", "cbow", "glove"))
    p.add_argument("--corpus", nargs="+", required=True,
                   help="an lmlab corpus folder (lmlab data build), or text files with one "
                        "sentence per line")
    p.add_argument("--split", default="train", help="the corpus split to read (train)")
    _common.add_out(p, "the vectors file: .bin = word2vec binary, else word2vec text")
    p.add_argument("--format", choices=("word2vec", "word2vec-binary", "glove"),
                   help="the file format (default: from --out's suffix)")
    p.add_argument("--dim", type=int, default=100, help="vector size (100)")
    p.add_argument("--window", type=int,
                   help="words on each side (word2vec: 5, its maximum in the dynamic window; "
                        "GloVe: 10)")
    p.add_argument("--min-count", type=int, default=5,
                   help="ignore words seen fewer times (5)")
    p.add_argument("--max-vocab", type=int, help="keep at most this many words, most frequent")
    p.add_argument("--epochs", type=int, help="passes over the corpus (word2vec 5, GloVe 15)")
    p.add_argument("--negative", type=int, default=5, help="word2vec: noise words per example")
    p.add_argument("--sample", type=float, default=1e-3,
                   help="word2vec: subsampling threshold (0 keeps every word)")
    p.add_argument("--alpha", type=float,
                   help="starting learning rate (word2vec 0.025, decaying linearly to "
                        "--min-alpha; GloVe's AdaGrad 0.05)")
    p.add_argument("--min-alpha", type=float, default=1e-4, help="word2vec: final learning rate")
    p.add_argument("--x-max", type=float, default=10.0, help="GloVe: weighting cut-off")
    p.add_argument("--workers", type=int, default=1,
                   help="threads training at once on shared tables, as gensim's workers and "
                        "glove.c's threads (1: the run repeats exactly)")
    _common.add_flags(p, seed=1)
    p.add_argument("--run", help="a run folder (config, checkpoints, cost report): the same "
                                 "command again resumes a killed run exactly, or extends one "
                                 "its --budget stopped (with a larger --budget)")
    p.add_argument("--budget", help="stop after this much training time (e.g. 10m), over all "
                                    "sessions of the --run; word2vec's learning rate then "
                                    "decays over the words the budget allows")
    p.add_argument("--checkpoint-every", default="1m",
                   help="with --run: training time between checkpoints (1m; 0: every step)")
    _common.add_overwrite(p, "replace --out if it exists, and start the --run over")

    p = commands.command(
        "evaluate", help="word similarity (Spearman) and analogies (accuracy per section)",
        example="lmlab vectors evaluate glove-6b-50d --limit 100000",
        handler=_evaluate, group="vectors")
    p.add_argument("vectors", help=SOURCE_HELP)
    p.add_argument("--limit", type=int, help="read only the first LIMIT words")
    p.add_argument("--similarity", default="wordsim353,simlex999",
                   help="similarity sets (names or files), comma-separated; '' for none")
    p.add_argument("--analogies", default="google",
                   help="analogy set (name or file); '' for none")
    p.add_argument("--method", default="3cosadd,3cosmul",
                   help="analogy methods, comma-separated: 3cosadd, 3cosmul")
    p.add_argument("--restrict-vocab", type=int, default=300_000,
                   help="only the first N words take part (gensim's convention)")
    p.add_argument("--case-sensitive", action="store_true",
                   help="match words with their case (default: case-insensitive, as gensim)")
    p.add_argument("--json", help="also write the scores to this JSON file")
    _common.add_overwrite(p, "replace --json if it exists")

    p = commands.command(
        "convert", help="rewrite word vectors in another format",
        example="lmlab vectors convert glove-6b-50d glove50.bin --to word2vec-binary",
        handler=_convert, group="vectors")
    p.add_argument("vectors", help=SOURCE_HELP)
    p.add_argument("out", help="the file to write")
    p.add_argument("--to", choices=("word2vec", "word2vec-binary", "glove"),
                   help="the format (default: word2vec binary for a .bin OUT, else word2vec text)")
    p.add_argument("--limit", type=int, help="write only the first LIMIT words")
    _common.add_overwrite(p, "replace OUT if it exists")

    p = commands.command(
        "align", help="map one space onto another (orthogonal Procrustes) and measure held-out "
                      "word translation (precision@1, nearest neighbour and CSLS)",
        example="lmlab vectors align ours.txt glove-6b-50d --top 5000",
        handler=_align, group="vectors")
    p.add_argument("source", help=SOURCE_HELP)
    p.add_argument("target", help=SOURCE_HELP)
    p.add_argument("--dictionary", help="seed dictionary file, one 'source target' pair per "
                                        "line (default: the words both spaces share)")
    p.add_argument("--top", type=int, default=5000,
                   help="without --dictionary: pair this many shared words, most frequent first")
    p.add_argument("--test-fraction", type=float, default=0.2,
                   help="fraction of the dictionary's source words held out for testing")
    p.add_argument("--target-vocab", type=int, default=50_000,
                   help="retrieve among the first N target words (CSLS's cost grows as N^2)")
    p.add_argument("--limit", type=int, help="read only the first LIMIT words of each space")
    _common.add_flags(p, "seed")
    p.add_argument("--save-mapping", help="write the (dim, dim) map as a .npy file")
    _common.add_overwrite(p, "replace --save-mapping if it exists")


def _train(args: argparse.Namespace) -> int:
    from lmlab.vectors.train import SETTINGS, train_vectors_file

    train_vectors_file(args.method, args.corpus, args.out,
                       {name: getattr(args, name) for name in SETTINGS}, split=args.split,
                       format=args.format, run_dir=args.run, budget=args.budget,
                       checkpoint_every=args.checkpoint_every, overwrite=args.overwrite)
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from lmlab.vectors.evaluate import evaluate_vectors_file

    evaluate_vectors_file(args.vectors, [s for s in args.similarity.split(",") if s],
                          args.analogies, [m for m in args.method.split(",") if m],
                          args.restrict_vocab, not args.case_sensitive, args.limit, args.json,
                          args.overwrite)
    return 0


def _convert(args: argparse.Namespace) -> int:
    from lmlab.vectors.keyed import convert_vectors

    convert_vectors(args.vectors, args.out, args.to, args.limit, args.overwrite)
    return 0


def _align(args: argparse.Namespace) -> int:
    from lmlab.vectors.align import align_files

    align_files(args.source, args.target, args.dictionary, args.top, args.test_fraction,
                args.target_vocab, args.limit, args.seed, args.save_mapping, args.overwrite)
    return 0
