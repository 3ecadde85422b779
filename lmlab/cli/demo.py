"""``lmlab demo``: the main job (what ``make demo`` runs)."""

from __future__ import annotations

import argparse

from lmlab.cli import _common


def register(commands) -> None:
    p = commands.command(
        "demo", help="pretrain, fine-tune and report end to end on the default corpus",
        example="lmlab demo --budget 20m --out runs/demo",
        handler=_demo,
        description="Build the default corpus (without the evaluation tasks' texts), train a "
                    "WordPiece tokenizer, pretrain a small BERT with masked LM, fine-tune it, "
                    "the same architecture randomly initialised and a TF-IDF baseline on two "
                    "tasks with three seeds, and MiniLM's frozen features as the ceiling, look "
                    "at words in context, and write a report. "
                    "Finished stages are cached: rerunning reuses them.",
    )
    p.add_argument("--budget", default="20m", help="wall-clock budget of the whole demo")
    _common.add_out(p, required=False, default="runs/demo")
    p.add_argument("--fresh", action="store_true", help="redo every stage")
    p.add_argument("--sources", help="corpus sources (default: every installed one)")
    p.add_argument("--max-documents", type=int, help="documents per source (quick runs)")
    p.add_argument("--size", default="mini", help="BERT preset size (tiny, mini, small, ...)")
    p.add_argument("--objective", default="mlm", help="pretraining objective(s), e.g. mlm,sop")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--tasks", default="fortunes-topic,wordnet-supersense")
    p.add_argument("--max-train-examples", type=int)
    p.add_argument("--max-eval-examples", type=int)
    p.add_argument("--vocab-size", type=int, default=8192)
    _common.add_precision(p, help="pretraining and fine-tuning precision (default auto: bf16 where "
                          "this host's measured bf16 matmul rate is at least 1.2x fp32's)")
    p.add_argument("--finetune-tokens",
                   help="training tokens of every pretrained and random-init fine-tuning run, "
                        "in whole epochs of each task, the same on every host (default 200k; "
                        "pretraining gets the time the budget leaves)")
    p.add_argument("--ceiling", default="minilm",
                   help="a pretrained checkpoint whose frozen features (with a trained head) "
                        "are the ceiling row, or 'none'")
    _common.add_threads(p, "torch threads (speed only)")
    _common.add_overwrite(p, "write into an --out folder that holds files other than a demo's")


def _demo(args: argparse.Namespace) -> int:
    from lmlab.demo.job import DemoConfig, load_summary, run_demo
    from lmlab.demo.report import print_summary
    from lmlab.utils.checks import parse_int_list
    from lmlab.utils.durations import parse_count, parse_duration

    config = DemoConfig(
        out=args.out, budget=parse_duration(args.budget),
        sources=args.sources.split(",") if args.sources else None,
        max_documents=args.max_documents, size=args.size, objective=args.objective,
        seeds=parse_int_list(args.seeds, "--seeds"),
        tasks=tuple(t.strip() for t in args.tasks.split(",") if t.strip()),
        max_train_examples=args.max_train_examples,
        max_eval_examples=args.max_eval_examples, vocab_size=args.vocab_size,
        precision=args.precision,
        **({} if args.finetune_tokens is None
           else {"finetune_tokens": parse_count(args.finetune_tokens)}),
        ceiling=None if args.ceiling.lower() == "none" else args.ceiling,
        fresh=args.fresh, threads=args.threads,
    )
    report = run_demo(config, overwrite=args.overwrite)
    print_summary(load_summary(args.out), report)
    return 0
