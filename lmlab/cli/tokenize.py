"""``lmlab tokenizer train|encode`` and ``lmlab data tokenize`` (corpus -> token shards)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lmlab.cli import _common


def register(commands: _common.CommandRegistry) -> None:
    p = commands.command(
        "train", help="train a WordPiece, byte-level BPE or Unigram tokenizer (or write ByT5's "
                      "byte tokenizer, which learns nothing: --kind byt5 without text)",
        example="lmlab tokenizer train --corpus corpus/ --kind wordpiece --vocab-size 8000 "
                "--out tok/",
        handler=_train, group="tokenizer")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--corpus", help="lmlab corpus folder (its train split is used)")
    source.add_argument("--files", nargs="+", type=Path, help="text files, one text per line")
    p.add_argument("--kind", choices=("wordpiece", "bpe", "unigram", "byt5"), default="wordpiece")
    p.add_argument("--vocab-size", type=int, default=30522)
    p.add_argument("--min-frequency", type=int, default=2)
    p.add_argument("--limit-alphabet", type=int, default=None)
    p.add_argument("--special-tokens", nargs="+", default=None,
                   help="special tokens (default: the template's)")
    p.add_argument("--template", choices=("bert", "roberta", "gpt2", "t5"), default=None,
                   help="special-token template (default: bert/roberta/t5 by kind)")
    p.add_argument("--cased", action="store_true", help="keep case (no lower-casing)")
    p.add_argument("--extra-ids", type=int, default=None,
                   help="add <extra_id_0..N-1> sentinels for T5's span corruption (T5: 100; "
                        "default 0, byt5: 125)")
    _common.add_out(p, "folder to save the tokenizer in",
                    overwrite="save into an --out folder that already holds something")
    _encoding_errors_option(p)

    p = commands.command(
        "encode", help="show the tokens and ids of a text (or a pair)",
        example='lmlab tokenizer encode --tokenizer tok/ "The cat sat." --pair "It purred."',
        handler=_encode, group="tokenizer")
    p.add_argument("--tokenizer", required=True, help="tokenizer folder, .gguf file or short name (minilm, smollm2)")
    p.add_argument("text")
    p.add_argument("--pair", default=None, help="second segment")
    _common.add_flags(p, "max_length")
    _common.add_flag(p, "json", help="print the full encoding as JSON")

    p = commands.command(
        "tokenize", help="tokenize a corpus into memory-mapped token shards",
        example="lmlab data tokenize --tokenizer tok/ --corpus corpus/ --out shards/",
        handler=_tokenize, group="data")
    p.add_argument("--tokenizer", required=True, help="tokenizer folder, .gguf file or short name (minilm, smollm2)")
    p.add_argument("--corpus", required=True, help="lmlab corpus folder")
    _common.add_out(p, "shard folder (a killed run resumes here)")
    p.add_argument("--workers", type=int, default=1, help="encoding processes")
    p.add_argument("--shard-tokens", type=int, default=1 << 24, help="tokens per shard file")
    _common.add_overwrite(p, "replace shards of another tokenizer, corpus or shard size in "
                             "--out (the same settings resume without it)")
    _encoding_errors_option(p)


def _encoding_errors_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--encoding-errors", choices=("strict", "replace"), default="strict",
                        help="a byte that is not UTF-8: strict = error naming the file and "
                             "byte offset (default), replace = read it as U+FFFD")


def _train(args: argparse.Namespace) -> None:
    from lmlab.tokenization.tokenizer import Tokenizer
    from lmlab.tokenization.training import check_training_source
    from lmlab.utils.checks import check_at_least, check_output_folder
    from lmlab.utils.errors import LmlabError

    source = args.corpus or args.files
    check_at_least(args.extra_ids, 0, "--extra-ids")
    if args.kind == "byt5":
        if source:
            raise LmlabError("--kind byt5 learns nothing from text (its vocabulary is the 256 "
                             "bytes)", "drop --corpus / --files")
    elif not source:
        raise LmlabError(f"--kind {args.kind} is trained on text", "pass --corpus DIR or "
                         "--files FILE ...")
    else:
        check_training_source(source)  # before the (long) training, like the output check
    check_output_folder(args.out, args.overwrite, "tokenizer")
    if args.kind == "byt5":
        tok = Tokenizer.byt5(**({} if args.extra_ids is None else {"extra_ids": args.extra_ids}))
    else:
        tok = Tokenizer.train(source, kind=args.kind, vocab_size=args.vocab_size,
                              min_frequency=args.min_frequency,
                              limit_alphabet=args.limit_alphabet,
                              special_tokens=args.special_tokens, template=args.template,
                              lowercase=not args.cased, extra_ids=args.extra_ids or 0,
                              show_progress=True, encoding_errors=args.encoding_errors)
    tok.save_pretrained(args.out)
    print(f"{tok} saved to {args.out} (fingerprint {tok.fingerprint()[:12]})")


def _encode(args: argparse.Namespace) -> None:
    from lmlab.tokenization.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained(args.tokenizer)
    out = tok(args.text, args.pair, truncation=args.max_length is not None,
              max_length=args.max_length, return_offsets_mapping=True,
              return_special_tokens_mask=True, return_token_type_ids=True)
    if args.json:
        print(json.dumps({**dict(out), "tokens": out.tokens(0), "word_ids": out.word_ids(0)}))
        return
    for token, token_id, type_id in zip(out.tokens(0), out["input_ids"], out["token_type_ids"]):
        print(f"{token_id:>7}  {type_id}  {token}")


def _tokenize(args: argparse.Namespace) -> None:
    from lmlab.data.shards import build_shards

    manifest = build_shards(args.tokenizer, args.corpus, args.out,
                            shard_tokens=args.shard_tokens, workers=args.workers,
                            overwrite=args.overwrite, encoding_errors=args.encoding_errors)
    for split, info in manifest["splits"].items():
        print(f"{split}: {info['num_tokens']:,} tokens, {info['num_documents']:,} documents, "
              f"{info['num_sentences']:,} sentences in {len(info['shards'])} shards "
              f"({manifest['dtype']})")
    if manifest["resumed_shards"]:
        print(f"resumed: {manifest['resumed_shards']} finished shards verified and kept")
