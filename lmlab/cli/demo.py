"""``lmlab demo``: the main job (what ``make demo`` runs)."""

from __future__ import annotations

import argparse

from lmlab.cli import _common
from lmlab.utils.checks import parse_int_list
from lmlab.utils.durations import parse_count, parse_duration


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
    p.add_argument("--budget", default="20m", type=parse_duration,
                   help="wall-clock budget of the whole demo")
    _common.add_out(p, required=False, default="runs/demo")
    p.add_argument("--fresh", action="store_true", help="redo every stage")
    p.add_argument("--sources", type=lambda text: text.split(","),
                   help="corpus sources (default: every installed one)")
    p.add_argument("--max-documents", type=int, help="documents per source (quick runs)")
    p.add_argument("--size", default="mini", help="BERT preset size (tiny, mini, small, ...)")
    p.add_argument("--objective", default="mlm", help="pretraining objective(s), e.g. mlm,sop")
    p.add_argument("--seeds", default="0,1,2", type=lambda text: parse_int_list(text, "--seeds"))
    p.add_argument("--tasks", default="fortunes-topic,wordnet-supersense", type=lambda text: tuple(
        t.strip() for t in text.split(",") if t.strip()))
    p.add_argument("--max-train-examples", type=int)
    p.add_argument("--max-eval-examples", type=int)
    p.add_argument("--vocab-size", type=int, default=8192)
    _common.add_flag(p, "precision", help="pretraining and fine-tuning precision; "
                     + _common.PRECISION_HELP)
    p.add_argument("--finetune-tokens", default="200k", type=parse_count,
                   help="training tokens of every pretrained and random-init fine-tuning run, "
                        "in whole epochs of each task, the same on every host (pretraining gets "
                        "the time the budget leaves)")
    p.add_argument("--ceiling", default="minilm",
                   type=lambda text: None if text.lower() == "none" else text,
                   help="a pretrained checkpoint whose frozen features (with a trained head) "
                        "are the ceiling row, or 'none'")
    _common.add_flag(p, "threads", help="torch threads (speed only)")
    _common.add_overwrite(p, "write into an --out folder that holds files other than a demo's")


def _demo(args: argparse.Namespace) -> int:
    from lmlab.demo.job import DemoConfig, run_demo

    run_demo(_common.settings_from(DemoConfig, args), overwrite=args.overwrite)
    return 0
