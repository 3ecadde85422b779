"""``lmlab attention`` (an interactive HTML view of one text's attention) and ``lmlab
head-stats`` (Clark et al.'s per-head statistics over a text sample) and ``lmlab relation-heads``
(Clark et al.'s best head per dependency relation against the fixed-offset baseline)."""

from __future__ import annotations

import argparse
from pathlib import Path

from lmlab.cli import _common


def register(commands) -> None:
    p = commands.command(
        "attention", help="write one self-contained HTML page showing a text's attention, "
                          "every layer and head",
        example='lmlab attention minilm "The cat sat on the mat." --out view.html',
        handler=_attention)
    p.add_argument("model", help="model folder, run directory, .gguf file or short name")
    p.add_argument("text", help="the text to look at")
    p.add_argument("--pair", help="a second text (sentence pairs, for encoders)")
    p.add_argument("--target", help="the decoder's text (encoder-decoders: t5, bart, marian)")
    p.add_argument("--words", action="store_true",
                   help="merge word pieces into words (attention to a word summed, from a word "
                        "averaged)")
    _common.add_out(p, "the .html file to write", overwrite="replace an existing --out file")
    p.add_argument("--layer", type=int, default=0, help="the layer shown first (from 0)")
    p.add_argument("--head", type=int, default=0, help="the head shown first (from 0)")
    p.add_argument("--stats-sample", type=int,
                   help="compute the head statistics over N sentences (of --corpus, else of "
                        "WordNet's example sentences) instead of the text itself")
    p.add_argument("--corpus", help="lmlab corpus folder for --stats-sample")
    _common.add_flag(p, "max_length", help="cut the text to this many tokens (default: the "
                                             "model's limit)")

    p = commands.command(
        "head-stats", help="what each attention head attends to ([CLS], [SEP], punctuation, "
                           "previous/next token, itself; entropy) over a text sample",
        example="lmlab head-stats minilm --sample 200 --out head-stats/",
        handler=_head_stats)
    p.add_argument("model", help="model folder, run directory, .gguf file or short name")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--corpus", help="lmlab corpus folder: its first --sample sentences")
    source.add_argument("--text-file", help="a text file: its first --sample non-empty lines")
    p.add_argument("--sample", type=int, default=500,
                   help="texts to average over (default 500; WordNet's example sentences "
                        "unless --corpus or --text-file)")
    _common.add_flag(p, "batch_size", default=16, help="texts per forward pass")
    _common.add_flag(p, "max_length", help="cut texts to this many tokens (default: the model's "
                                           "limit)")
    _common.add_out(p, "folder for head_stats.{json,csv,md,png}", overwrite="replace what --out holds")

    p = commands.command(
        "relation-heads", help="Clark et al.'s relation heads: per dependency relation (spaCy's "
                               "silver parses), the head that best points from dependent to "
                               "head, against the best fixed offset",
        example="lmlab relation-heads minilm --sample 2000 --out relation-heads/",
        handler=_relation_heads)
    p.add_argument("model", help="model folder, run directory or short name")
    p.add_argument("--sample", type=int, default=5000,
                   help="WordNet example sentences to parse and score (default 5000)")
    p.add_argument("--text-file", help="score the first --sample non-empty lines of this file "
                                       "instead")
    p.add_argument("--min-count", type=int, default=100,
                   help="relations with fewer words are left out of the table (default 100)")
    _common.add_flag(p, "batch_size", default=32, help="sentences per forward pass")
    _common.add_flag(p, "max_length", help="leave out sentences longer than this many tokens "
                                           "(default: the model's limit)")
    _common.add_out(p, "folder for relation_heads.{json,md,png}",
                    overwrite="replace what --out holds")


def _load(model_path: str):
    """The model and tokenizer (the path checked first, so a typo fails before torch loads)."""
    from lmlab.utils.catalog import resolve_model_dir

    resolve_model_dir(model_path)
    from lmlab.load import load_model_and_tokenizer

    return load_model_and_tokenizer(model_path)


def _attention(args: argparse.Namespace) -> int:
    from lmlab.utils.checks import check_at_least, check_output_file
    from lmlab.utils.errors import LmlabError

    if Path(args.out).suffix.lower() not in (".html", ".htm"):
        raise LmlabError(f"--out {args.out} is not an .html file",
                         "give --out a file name ending in .html, e.g. --out view.html")
    check_output_file(args.out, args.overwrite)
    if not args.text.strip():
        raise LmlabError("the text is empty", "give a sentence to look at")
    check_at_least(args.stats_sample, 1, "--stats-sample")
    check_at_least(args.max_length, 2, "--max-length")
    if args.corpus is not None and args.stats_sample is None:
        raise LmlabError("--corpus is only read for --stats-sample",
                         "add --stats-sample N (sentences of the corpus to average over)")
    _common.check_corpus(args.corpus)
    check_at_least(args.layer, 0, "--layer")
    check_at_least(args.head, 0, "--head")

    from lmlab.analysis.attention_view import write_attention_view

    model, tokenizer = _load(args.model)
    path, maps, shown = write_attention_view(
        model, tokenizer, args.out, args.text, args.pair, args.target, args.words, args.layer,
        args.head, args.stats_sample, args.corpus, args.max_length,
        title=f"Attention of {args.model}")
    for note in maps.truncation_notes():
        print(f"note: {note}")
    size = path.stat().st_size / 1e6
    print(f"wrote {path} ({size:.1f} MB): {maps.num_layers} layers x {maps.num_heads} heads, "
          f"{len(shown.tokens)} {'words' if args.words else 'tokens'}; open it in a browser")
    return 0


def _head_stats(args: argparse.Namespace) -> int:
    from lmlab.utils.checks import check_at_least, check_file, check_output_folder

    check_at_least(args.sample, 1, "--sample")
    check_at_least(args.batch_size, 1, "--batch-size")
    check_at_least(args.max_length, 2, "--max-length")
    _common.check_corpus(args.corpus)
    if args.text_file is not None:
        check_file(args.text_file, "--text-file", "give a UTF-8 text file, one text a line")
    check_output_folder(args.out, args.overwrite, "head statistics")

    from lmlab.analysis import attention as A

    texts, description = A.text_sample(args.sample, corpus=args.corpus,
                                       text_file=args.text_file)
    model, tokenizer = _load(args.model)
    stats = A.head_statistics(model, tokenizer, texts, batch_size=args.batch_size,
                              max_length=args.max_length, sample=description,
                              show_progress=True)
    A.write_head_statistics(stats, args.out, title=f"{args.model}: attention head statistics")
    if stats.truncated:
        print(f"note: {stats.truncated} of the texts were longer than the model takes and were cut")
    print(stats.to_markdown(), end="")
    print(f"wrote head_stats.json, head_stats.csv, head_stats.md and head_stats.png to {args.out}")
    return 0


def _relation_heads(args: argparse.Namespace) -> int:
    from lmlab.utils.checks import check_at_least, check_file, check_output_folder

    check_at_least(args.sample, 1, "--sample")
    check_at_least(args.min_count, 1, "--min-count")
    check_at_least(args.batch_size, 1, "--batch-size")
    check_at_least(args.max_length, 2, "--max-length")
    if args.text_file is not None:
        check_file(args.text_file, "--text-file", "give a UTF-8 text file, one sentence a line")
    check_output_folder(args.out, args.overwrite, "relation heads")

    from lmlab.analysis import attention as A
    from lmlab.analysis import relation_heads as R
    from lmlab.tasks.probing import SPACY_MODEL, load_spacy

    nlp = load_spacy()  # before the model: a missing spaCy fails first
    texts, description = A.text_sample(args.sample, text_file=args.text_file)
    parsed = R.parse_sentences(texts, nlp)
    model, tokenizer = _load(args.model)
    result = R.relation_heads(model, tokenizer, parsed, batch_size=args.batch_size,
                              max_length=args.max_length, name=Path(args.model).name,
                              sample=f"{description}, spaCy {SPACY_MODEL} parses (silver)")
    R.write_relation_heads(result, args.out, args.min_count)
    if result.skipped:
        print(f"note: {result.skipped} sentences were left out (longer than the model takes, or "
              "a word without a token)")
    print(result.to_markdown(args.min_count), end="")
    print(f"wrote relation_heads.json, relation_heads.md and relation_heads.png to {args.out}")
    return 0
