"""``lmlab seq2seq data|train|evaluate``: text-to-text tasks for encoder-decoders (symbolic
integration, decompilation, WordNet definitions, the reverse dictionary), end to end."""

from __future__ import annotations

import argparse
import json

from lmlab.cli import _common


def register(commands) -> None:
    p = commands.command(
        "data", help="write a text-to-text task's splits (generated for a seed, or WordNet's)",
        example="lmlab seq2seq data --task integration --count 50000 --out data/integration",
        handler=_data, group="seq2seq")
    p.add_argument("--task", required=True,
                   choices=("integration", "decompile", "definitions", "reverse-dictionary",
                            "wordnet-supersense", "wordnet-wic", "fortunes-topic"),
                   help="an inverse problem, a WordNet text task, or a built-in "
                        "classification task in T5's formulation (label as a word)")
    p.add_argument("--count", type=int,
                   help="expressions (integration) or C functions (decompile) to generate, or "
                        "the most train pairs kept")
    p.add_argument("--generator", choices=("bwd", "fwd", "ibp"),
                   help="integration: backward (F random, f = F'; the default), forward (f "
                        "random, F by sympy under --timeout) or integration by parts")
    p.add_argument("--grammar", choices=("small", "paper"),
                   help="integration: our small expressions (default) or Lample & Charton's "
                        "(up to 15 operators, division, fifteen unary functions)")
    p.add_argument("--max-ops", type=int, help="integration: at most this many operators")
    p.add_argument("--timeout", type=float,
                   help="integration: seconds sympy may take per expression (default 2)")
    p.add_argument("--max-statements", type=int,
                   help="decompile: statements per function at most (default 4)")
    p.add_argument("--levels", help="decompile: optimisation levels compiled, e.g. O0,O1 "
                                    "(the default)")
    _common.add_flags(p, "seed")
    _common.add_out(p, "output folder", overwrite="write into a non-empty --out")

    p = commands.command(
        "train", help="train an encoder-decoder on a task folder (from scratch or --init)",
        example="lmlab seq2seq train --data data/integration --family marian --layers 3 "
                "--hidden 256 --budget 30m --out runs/integration",
        handler=_train, group="seq2seq")
    p.add_argument("--data", required=True, help="folder written by `lmlab seq2seq data`")
    _common.add_out(p, "run folder (model/, metrics, checkpoints)")
    model = p.add_mutually_exclusive_group()
    model.add_argument("--family", choices=("marian", "bart", "t5", "mt5"), default="marian",
                       help="architecture trained from scratch (marian: the original "
                            "Transformer's layout)")
    model.add_argument("--init", help="start from this encoder-decoder folder (its tokenizer)")
    p.add_argument("--size", default=None, help="the family's preset (default: its smallest)")
    p.add_argument("--layers", type=int, help="encoder and decoder layers each")
    p.add_argument("--hidden", type=int, help="width (heads of 64 dims, FFN 4x)")
    p.add_argument("--tokenizer", help="tokenizer folder for a text task trained from scratch "
                                       "(integration builds its own from the symbols)")
    _common.add_flags(p, "steps", "budget", "precision", "seed", "threads", "device",
                      batch_size=32, lr=5e-4, warmup=0.05)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--label-smoothing", type=float, default=0.0)
    p.add_argument("--max-source-length", type=int, default=256)
    p.add_argument("--max-target-length", type=int, default=256)
    _common.add_overwrite(p, "replace an existing run in --out")

    p = commands.command(
        "evaluate", help="decode a split and score it (verified accuracy, BLEU/chrF, exact match)",
        example="lmlab seq2seq evaluate --model runs/integration/model --data data/integration "
                "--beams 1,5,10",
        handler=_evaluate, group="seq2seq")
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True, nargs="+",
                   help="task folder(s); several (e.g. BWD, FWD and IBP test sets) give one "
                        "table of them")
    p.add_argument("--split", default="test", choices=("dev", "test"))
    p.add_argument("--beams", default="1", help="comma-separated beam sizes, e.g. 1,5,10")
    p.add_argument("--max-examples", type=int, help="score the first N examples of the split")
    p.add_argument("--max-new-tokens", type=int, default=128)
    _common.add_out(p, "write the metrics (JSON) here", required=False,
                    overwrite="replace an existing --out file")
    _common.add_flags(p, "threads")


def _data(args: argparse.Namespace) -> int:
    from lmlab.tasks.inverse import task_info, write_task_data
    from lmlab.utils.checks import check_at_least
    from lmlab.utils.errors import LmlabError

    check_at_least(args.count, 1, "--count")
    check_at_least(args.max_ops, 1, "--max-ops")
    check_at_least(args.max_statements, 1, "--max-statements")
    if args.timeout is not None and args.timeout <= 0:
        raise LmlabError(f"--timeout {args.timeout} must be positive", "pass e.g. --timeout 2")
    generation = {name: value for name, value in (
        ("generator", args.generator), ("grammar", args.grammar), ("max_ops", args.max_ops),
        ("timeout", args.timeout), ("max_statements", args.max_statements),
        ("levels", args.levels.split(",") if args.levels else None)) if value is not None}
    sizes = write_task_data(args.task, args.out, args.count, args.seed, args.overwrite,
                            show_progress=True, **generation)
    print(f"{args.task}: " + ", ".join(f"{split} {n:,}" for split, n in sizes.items())
          + f" -> {args.out}")
    for split, shares in task_info(args.out).get("overlap", {}).items():
        print(f"{split} already in train: " + ", ".join(f"{kind.replace('_', ' ')} {share:.1%}"
                                                      for kind, share in shares.items()))
    return 0


def _train(args: argparse.Namespace) -> int:
    from lmlab.cli._training_config import print_trained, training_config
    from lmlab.finetune.text_to_text import train_on_task

    cfg = training_config(args, ("layers", "hidden", "batch_size", "steps", "threads",
                                 "max_source_length", "max_target_length"),
                          "--budget 30m or --steps 5000")
    result = train_on_task(args.data, args.out, cfg, family=args.family, size=args.size,
                           layers=args.layers, hidden=args.hidden, init=args.init,
                           tokenizer=args.tokenizer, dropout=args.dropout,
                           label_smoothing=args.label_smoothing,
                           max_source_length=args.max_source_length,
                           max_target_length=args.max_target_length, overwrite=args.overwrite)
    print_trained(result, args.out)
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    import torch

    from lmlab.finetune.text_to_text import evaluate_on_task
    from lmlab.tasks.inverse import read_task_data
    from lmlab.utils.checks import check_at_least, check_output_file, parse_int_list

    beams = sorted(set(parse_int_list(args.beams, "--beams", "1,5,10")))
    check_at_least(beams[0], 1, "--beams")
    check_at_least(args.max_examples, 1, "--max-examples")
    check_at_least(args.max_new_tokens, 1, "--max-new-tokens")
    check_at_least(args.threads, 1, "--threads")
    if args.out:
        check_output_file(args.out, args.overwrite)
    for folder in args.data:
        read_task_data(folder)  # task folders, before the model loads
    if args.threads:
        torch.set_num_threads(args.threads)
    if len(args.data) == 1:
        results = evaluate_on_task(args.model, args.data[0], args.split, beams,
                                   args.max_examples, args.max_new_tokens, out=args.out)
        print(json.dumps(results, indent=2))
        return 0
    results = {folder: evaluate_on_task(args.model, folder, args.split, beams,
                                        args.max_examples, args.max_new_tokens)
               for folder in args.data}
    if args.out:
        from lmlab.utils.io import atomic_write_json

        atomic_write_json(args.out, results)
    print(json.dumps(results, indent=2))
    print(_table(results, beams))
    return 0


def _table(results: dict, beams: list[int]) -> str:
    """One row per task folder, one column per beam: verified accuracy for integration (the
    unverifiable share in brackets), else the first metric."""
    lines = ["| data | examples | " + " | ".join(f"beam {b}" for b in beams) + " |",
             "|---|---:|" + "---:|" * len(beams)]
    for folder, result in results.items():
        cells = []
        for beam in beams:
            scores = result[f"beam {beam}"]
            if "verified_accuracy" in scores:
                cells.append(f"{scores['verified_accuracy']:.1%} "
                             f"({scores['unverifiable']:.1%})")
            else:
                name = next(k for k, v in scores.items() if isinstance(v, float))
                cells.append(f"{name} {scores[name]:.3f}")
        lines.append(f"| {folder} | {result['examples']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
