"""``lmlab vectors``: static word vectors — evaluate, convert between formats, align spaces."""

from __future__ import annotations

import argparse

SOURCE_HELP = "a word2vec (.txt, .bin) or GloVe (.txt) file, or glove-6b-50d"


def register(commands) -> None:
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
