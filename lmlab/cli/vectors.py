"""``lmlab vectors``: static word vectors — train (word2vec, GloVe), evaluate, convert between
formats, align spaces."""

from __future__ import annotations

import argparse

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
    p.add_argument("--out", required=True,
                   help="the vectors file: .bin = word2vec binary, else word2vec text")
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
    p.add_argument("--batch-pairs", type=int, default=512,
                   help="word2vec: examples per SGD step")
    p.add_argument("--x-max", type=float, default=10.0, help="GloVe: weighting cut-off")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads while training (1: the steps are too small to share)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--run", help="a run folder (config, checkpoints, cost report): the same "
                                 "command again resumes a killed run exactly, or extends one "
                                 "its --budget stopped (with a larger --budget)")
    p.add_argument("--budget", help="stop after this much training time (e.g. 10m), over all "
                                    "sessions of the --run; word2vec's learning rate then "
                                    "decays over the words the budget allows")
    p.add_argument("--checkpoint-every", default="1m",
                   help="with --run: training time between checkpoints (1m; 0: every step)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace --out if it exists, and start the --run over")

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
    p.add_argument("--overwrite", action="store_true", help="replace --json if it exists")

    p = commands.command(
        "convert", help="rewrite word vectors in another format",
        example="lmlab vectors convert glove-6b-50d glove50.bin --to word2vec-binary",
        handler=_convert, group="vectors")
    p.add_argument("vectors", help=SOURCE_HELP)
    p.add_argument("out", help="the file to write")
    p.add_argument("--to", default="word2vec", choices=("word2vec", "word2vec-binary", "glove"))
    p.add_argument("--limit", type=int, help="write only the first LIMIT words")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")

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
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-mapping", help="write the (dim, dim) map as a .npy file")
    p.add_argument("--overwrite", action="store_true", help="replace --save-mapping if it exists")


def _train_config(args: argparse.Namespace):
    """The word2vec or GloVe config of ``lmlab vectors train``'s flags, validated."""
    if args.method == "glove":
        from lmlab.vectors.glove import GloveConfig

        config = GloveConfig(dim=args.dim, min_count=args.min_count, max_vocab=args.max_vocab,
                             x_max=args.x_max, seed=args.seed, threads=args.threads)
        for flag, name in (("window", "window"), ("epochs", "epochs"), ("alpha", "learning_rate")):
            if getattr(args, flag) is not None:
                setattr(config, name, getattr(args, flag))
    else:
        from lmlab.vectors.word2vec import Word2VecConfig

        config = Word2VecConfig(architecture=args.method, dim=args.dim, negative=args.negative,
                                min_count=args.min_count, max_vocab=args.max_vocab,
                                sample=args.sample, min_alpha=args.min_alpha, seed=args.seed,
                                threads=args.threads, batch_pairs=args.batch_pairs)
        for name in ("window", "epochs", "alpha"):
            if getattr(args, name) is not None:
                setattr(config, name, getattr(args, name))
    config.validate()
    return config


def _train(args: argparse.Namespace) -> int:
    from pathlib import Path

    from lmlab.utils.checks import check_output_file
    from lmlab.utils.durations import parse_duration
    from lmlab.utils.errors import LmlabError

    config = _train_config(args)
    from lmlab.training.loop_run import LoopRun, writes  # torch: after the flags' checks

    budget = parse_duration(args.budget) if args.budget is not None else None
    checkpoint_seconds = parse_duration(args.checkpoint_every)
    check_output_file(args.out, args.overwrite or writes(args.run, "vectors", args.out), "--out")
    fmt = args.format or ("word2vec-binary" if Path(args.out).suffix == ".bin" else "word2vec")
    from lmlab.vectors.sentences import sentences_from

    sentences = sentences_from(args.corpus, args.split)
    files = [Path(c) for c in args.corpus if Path(c).is_file()]
    if files and all(f.stat().st_size == 0 for f in files):
        raise LmlabError(f"the corpus file{'s' if len(files) > 1 else ''} "
                         f"{', '.join(map(str, files))} {'are' if len(files) > 1 else 'is'} "
                         "empty", "give text with one sentence per line")
    from lmlab.vectors.keyed import save_vectors

    if args.method == "glove":
        from lmlab.vectors.glove import loop_hparams, train_glove
    else:
        from lmlab.vectors.word2vec import loop_hparams, train_word2vec
    run = LoopRun(args.run, loop_hparams(config), speed={"threads": config.threads},
                  budget_seconds=budget, checkpoint_seconds=checkpoint_seconds,
                  overwrite=args.overwrite, what=f"{args.method} run", option="--run",
                  outputs={"vectors": str(Path(args.out).resolve())})
    if args.method == "glove":
        vectors, summary = train_glove(sentences, config, run=run)
        print(f"GloVe: {summary.vocabulary} words, {summary.corpus_words} corpus words, "
              f"{summary.entries} non-zero co-occurrences; loss per entry "
              f"{_losses(summary.epoch_loss, 4)}; counted in {summary.count_seconds:.1f} s, "
              f"trained in {summary.train_seconds:.1f} s")
    else:
        vectors, summary = train_word2vec(sentences, config, run=run)
        print(f"word2vec {config.architecture}: {summary.vocabulary} words, "
              f"{summary.corpus_words} corpus words x {config.epochs} epochs; loss per example "
              f"{_losses(summary.epoch_loss, 3)}; {summary.words_per_second:,.0f} words/s")
    save_vectors(vectors, args.out, fmt, overwrite=True)  # --out was checked before any work
    if summary.stop_reason == "budget":
        print(f"stopped by the --budget of {args.budget}: a larger one on the same --run "
              "continues the run")
    print(f"cost of this session: {summary.cost['tokens']:,} "
          f"{'entries' if args.method == 'glove' else 'words'}, {summary.cost['flops']:.3g} "
          f"FLOPs, {summary.cost['wall_seconds']:.1f} s"
          + (f" ({args.run}/cost.md)" if args.run else ""))
    print(f"wrote {vectors} to {args.out} ({fmt})")
    return 0


def _losses(epoch_loss: list[float], digits: int) -> str:
    """The first and the last epoch's loss (none when a budget ended the first epoch)."""
    if not epoch_loss:
        return "no epoch finished"
    return f"{epoch_loss[0]:.{digits}f} -> {epoch_loss[-1]:.{digits}f}"


def _evaluate(args: argparse.Namespace) -> int:
    from lmlab.utils.checks import check_at_least, check_names, check_output_file
    from lmlab.vectors.evaluate import ANALOGY_METHODS, evaluation_file

    similarity = [s for s in args.similarity.split(",") if s]
    methods = [m for m in args.method.split(",") if m]
    check_names(methods, list(ANALOGY_METHODS), "--method", "analogy method")
    check_at_least(args.restrict_vocab, 1, "--restrict-vocab")
    if args.limit is not None:
        check_at_least(args.limit, 1, "--limit")
    for dataset in [*similarity, *([args.analogies] if args.analogies else [])]:
        evaluation_file(dataset)  # a missing set is refused before the vectors load
    if args.json:
        check_output_file(args.json, args.overwrite, "--json")
    from lmlab.utils.io import atomic_write_json
    from lmlab.vectors.evaluate import evaluate_analogies, evaluate_similarity
    from lmlab.vectors.keyed import load_vectors

    vectors = load_vectors(args.vectors, limit=args.limit)
    print(f"{args.vectors}: {vectors}")
    scores: dict = {"vectors": str(args.vectors), "words": len(vectors), "dim": vectors.dim,
                    "restrict_vocab": args.restrict_vocab, "similarity": {}, "analogies": {}}
    case_insensitive = not args.case_sensitive
    for dataset in similarity:
        r = evaluate_similarity(vectors, dataset, args.restrict_vocab, case_insensitive)
        print(f"{r.dataset:<12} Spearman {r.spearman:.3f}  Pearson {r.pearson:.3f}  "
              f"({r.pairs} pairs, {r.oov} with unknown words)")
        scores["similarity"][r.dataset] = {"spearman": r.spearman, "pearson": r.pearson,
                                           "pairs": r.pairs, "oov": r.oov}
    for method in methods if args.analogies else []:
        r = evaluate_analogies(vectors, args.analogies, method, args.restrict_vocab,
                               case_insensitive)
        print(f"{args.analogies} analogies, {method}: {100 * r.accuracy:.1f}% of {r.scored} "
              f"({r.oov} with unknown words)")
        for section, (correct, scored) in r.sections.items():
            share = f"{100 * correct / scored:5.1f}%" if scored else "    -"
            print(f"    {section:<30} {share} of {scored}")
        scores["analogies"][method] = {"accuracy": r.accuracy, "scored": r.scored, "oov": r.oov,
                                       "sections": {s: {"correct": c, "scored": n}
                                                    for s, (c, n) in r.sections.items()}}
    if args.json:
        atomic_write_json(args.json, scores)
        print(f"wrote {args.json}")
    return 0


def _convert(args: argparse.Namespace) -> int:
    from lmlab.utils.checks import check_at_least, check_output_file

    if args.limit is not None:
        check_at_least(args.limit, 1, "--limit")
    check_output_file(args.out, args.overwrite, "OUT")
    from lmlab.vectors.keyed import load_vectors, save_vectors

    vectors = load_vectors(args.vectors, limit=args.limit)
    save_vectors(vectors, args.out, args.to, overwrite=args.overwrite)
    print(f"wrote {vectors} to {args.out} ({args.to})")
    return 0


def _align(args: argparse.Namespace) -> int:
    from lmlab.utils.checks import check_at_least, check_file, check_output_file

    check_at_least(args.top, 1, "--top")
    check_at_least(args.target_vocab, 1, "--target-vocab")
    if args.limit is not None:
        check_at_least(args.limit, 1, "--limit")
    if args.dictionary:
        check_file(args.dictionary, "--dictionary", "give a file of 'source target' lines")
    if args.save_mapping:
        check_output_file(args.save_mapping, args.overwrite, "--save-mapping")
    import numpy as np

    from lmlab.vectors.align import align_spaces, identical_word_pairs, read_dictionary
    from lmlab.vectors.keyed import load_vectors

    source = load_vectors(args.source, limit=args.limit)
    target = load_vectors(args.target, limit=args.limit)
    pairs = (read_dictionary(args.dictionary) if args.dictionary
             else identical_word_pairs(source, target, args.top))
    report = align_spaces(source, target, pairs, args.test_fraction, args.seed,
                          target_vocab=args.target_vocab)
    print(f"fitted on {report.train_pairs} pairs, tested on {report.test_words} held-out words "
          f"({report.skipped_pairs} dictionary pairs without vectors)")
    for name, label in (("unaligned", "unaligned (W = I)"), ("nn", "Procrustes + nearest"),
                        ("csls", "Procrustes + CSLS")):
        print(f"    {label:<24} precision@1 {100 * report.precision[name]:.1f}%")
    if args.save_mapping:
        from lmlab.utils.io import atomic_path

        with atomic_path(args.save_mapping) as tmp, open(tmp, "wb") as handle:
            np.save(handle, report.mapping)
        print(f"wrote {args.save_mapping}")
    return 0
