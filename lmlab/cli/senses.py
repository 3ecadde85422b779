"""``lmlab senses``: which layer of an encoder separates WordNet word senses best."""

from __future__ import annotations

import argparse

from lmlab.cli import _common


def register(commands) -> None:
    p = commands.command(
        "senses", help="word-sense classification per layer on WordNet's example sentences "
                       "(nearest sense centroid and 1-NN, with MFS and GloVe baselines)",
        example="lmlab senses minilm --pos n,v --max-lemmas 300 --out senses/",
        handler=_senses)
    p.add_argument("model", help="model folder, run directory or catalog name (minilm)")
    p.add_argument("--pos", default="n,v,a,r",
                   help="parts of speech, comma-separated: n (noun), v, a (adjective), r")
    p.add_argument("--max-lemmas", type=int, help="this many lemmas, picked by hash (default all)")
    p.add_argument("--window", type=int, default=5,
                   help="context words on each side for the GloVe baseline")
    p.add_argument("--no-glove", action="store_true", help="skip the GloVe baseline")
    _common.add_flag(p, "batch_size", default=32, help="texts per forward pass")
    _common.add_out(p, "folder for senses.json and senses.png", required=False,
                    overwrite="replace the files in --out")


def _senses(args: argparse.Namespace) -> int:
    from lmlab.analysis.senses import POS_NAMES
    from lmlab.utils.checks import check_at_least, check_names, check_output_folder

    pos = [p.strip() for p in args.pos.split(",") if p.strip()]
    check_names(pos, list(POS_NAMES), "--pos", "part of speech")
    if args.max_lemmas is not None:
        check_at_least(args.max_lemmas, 1, "--max-lemmas")
    check_at_least(args.window, 1, "--window")
    check_at_least(args.batch_size, 1, "--batch-size")
    if args.out:
        check_output_folder(args.out, args.overwrite, "word-sense results",
                            ignore=(".*.tmp",))
    from lmlab.analysis.senses import wsd_by_layer
    from lmlab.load import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(args.model)
    report = wsd_by_layer(model, tokenizer, pos=pos, max_lemmas=args.max_lemmas,
                          window=args.window, batch_size=args.batch_size,
                          static_baseline=not args.no_glove, name=str(args.model))
    print(report.table())
    if args.out:
        from lmlab.analysis.report import write_files

        json_file, png = write_files(args.out, {"senses.json": report.to_dict(),
                                                "senses.png": report.plot})
        print(f"wrote {json_file} and {png}")
    return 0
