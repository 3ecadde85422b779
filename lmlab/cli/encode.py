"""``lmlab fill-mask``, ``lmlab embed`` and ``lmlab neighbours``: look at what an encoder knows."""

from __future__ import annotations

import argparse
import json

from lmlab.cli import _common


def register(commands) -> None:
    p = commands.command(
        "fill-mask", help="top-k guesses of a masked-LM for each [MASK] in a text",
        example='lmlab fill-mask runs/mini "Paris is the [MASK] of France."',
        handler=_fill_mask)
    p.add_argument("model", help="model folder, run directory")
    p.add_argument("text", nargs="+", help="text(s) with one or more [MASK] tokens")
    p.add_argument("--top-k", type=int, default=5)
    _common.add_flag(p, "json", help="print JSON instead of a table")

    p = commands.command(
        "embed", help="sentence vectors (or token vectors) of texts from any layer",
        example='lmlab embed minilm "The vase broke." "Dawn broke." --pooling mean',
        handler=_embed)
    p.add_argument("model")
    p.add_argument("texts", nargs="+")
    p.add_argument("--pooling", default="mean", choices=["cls", "mean", "max", "none"])
    p.add_argument("--layer", default="last",
                   help="layer index (0 = embeddings) or a strategy: embeddings, last, "
                        "second_to_last, sum_last_four, concat_last_four, weighted_sum_all")
    p.add_argument("--normalize", action="store_true")
    _common.add_out(p, "write vectors to this .npy file instead of printing", required=False,
                    overwrite="replace an existing --out file")

    p = commands.command(
        "neighbours", help="contextual nearest neighbours of a word, next to its static vector",
        example='lmlab neighbours minilm --corpus corpus/ --word broke "The vase broke." "Dawn broke."',
        handler=_neighbours)
    p.add_argument("model")
    p.add_argument("queries", nargs="+", help="query sentences containing --word")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--corpus", help="lmlab corpus directory to index")
    source.add_argument("--wordnet-examples", action="store_true",
                        help="index WordNet's example sentences (installed; no corpus needed)")
    p.add_argument("--word", required=True)
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--layer", default="last",
                   help="layer index, strategy, or all (the neighbours at every layer, from one "
                        "forward pass)")
    p.add_argument("--limit", type=int, default=2000, help="occurrences to index at most")


def _fill_mask(args: argparse.Namespace) -> int:
    from lmlab.pipelines import pipeline
    from lmlab.utils.checks import check_at_least

    check_at_least(args.top_k, 1, "--top-k")
    fill = pipeline("fill-mask", model=args.model)
    for text in args.text:
        result = fill(text, top_k=args.top_k)
        groups = result if result and isinstance(result[0], list) else [result]
        if args.json:
            print(json.dumps({"text": text, "masks": groups}, ensure_ascii=False))
            continue
        print(text)
        for number, guesses in enumerate(groups, 1):
            label = f"  mask {number}: " if len(groups) > 1 else "  "
            print(label + "  ".join(f"{g['token_str']} ({g['score']:.3f})" for g in guesses))
    return 0


def _layer(value: str) -> int | str:
    """A layer index (``-1``, ``0``, ...) or a strategy name of
    :data:`lmlab.models.pooling.STRATEGIES`; an unknown name is refused before loading."""
    if value.lstrip("-").isdigit():
        return int(value)
    from lmlab.models.pooling import STRATEGIES
    from lmlab.utils.checks import check_names

    check_names([value], list(STRATEGIES), "--layer", "layer strategy")
    return value


def _embed(args: argparse.Namespace) -> int:
    from lmlab.pipelines import pipeline

    if args.out:
        from lmlab.utils.checks import check_output_file

        check_output_file(args.out, args.overwrite)
    embed = pipeline("feature-extraction", model=args.model, layer=_layer(args.layer))
    pooling = None if args.pooling == "none" else args.pooling
    vectors = embed(args.texts, pooling=pooling, normalize=args.normalize)
    if args.out:
        import numpy as np

        from lmlab.utils.io import atomic_path

        with atomic_path(args.out) as tmp, open(tmp, "wb") as handle:
            np.save(handle, vectors.numpy() if pooling else np.array([v.numpy() for v in vectors],
                                                                    dtype=object))
        print(f"wrote {len(args.texts)} vectors to {args.out}")
        return 0
    for text, vector in zip(args.texts, vectors):
        head = ", ".join(f"{x:.4f}" for x in vector.flatten()[:6].tolist())
        print(f"{text!r}: shape {tuple(vector.shape)} [{head}, ...]")
    return 0


def _neighbours(args: argparse.Namespace) -> int:
    from lmlab.utils.checks import check_at_least
    from lmlab.utils.errors import LmlabError

    if args.corpus:
        _common.check_corpus(args.corpus, also=", or use --wordnet-examples")
    check_at_least(args.k, 1, "--k")
    check_at_least(args.limit, 1, "--limit")
    if not args.word.strip():
        raise LmlabError("--word is empty", "give the word to look at, e.g. --word broke")
    for query in args.queries:  # the word as text; the index checks it again as a token
        if args.word.lower() not in query.lower():
            raise LmlabError(f"the query {query!r} does not contain the word {args.word!r}",
                             "use a query sentence that contains the indexed word")
    layer = "all" if args.layer == "all" else _layer(args.layer)
    from lmlab.analysis import neighbours
    from lmlab.load import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(args.model)
    sentences = (neighbours.corpus_sentences(args.corpus) if args.corpus
                 else neighbours.wordnet_sentences())
    index = neighbours.ContextualIndex.build(model, tokenizer, sentences, args.word,
                                             layer=layer, limit=args.limit)
    print(f"indexed {len(index.sentences)} occurrences of {args.word!r} from "
          f"{args.corpus or 'WordNet example sentences'}")
    static = neighbours.StaticWordVectors(model, tokenizer)
    print(f"\nstatic vector of {args.word!r} (same for every sentence) is nearest to: "
          + ", ".join(f"{w} ({s:.2f})" for w, s in static.nearest_words(args.word)))
    for query in args.queries:
        print(f"\n{query}")
        if layer != "all":
            for hit in index.query(query, k=args.k):
                print(f"  {hit.score:.3f}  {hit.sentence}")
            continue
        for number, hits in enumerate(index.query_by_layer(query, k=args.k)):
            print(f"  layer {number}{' (embeddings)' if number == 0 else ''}:")
            for hit in hits:
                shown = hit.sentence if len(hit.sentence) <= 90 else hit.sentence[:87] + "..."
                print(f"    {hit.score:.3f}  {shown}")
    return 0
