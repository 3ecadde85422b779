"""``lmlab finetune`` and ``lmlab evaluate``: fine-tune a model on a task, score a run."""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any

from lmlab.cli import _common
from lmlab.cli._task_options import add_task_arguments, task_from_args
from lmlab.training.config import PRECISIONS


def register(commands) -> None:
    p = commands.command(
        "finetune", help="fine-tune a model on a task (BERT, ULMFiT or feature-based recipe), "
        "over one or several seeds",
        example="lmlab finetune --task wordnet-supersense --model minilm --out runs/ss "
                "--seeds 0,1,2 --max-train-examples 1000",
        handler=_finetune)
    add_task_arguments(p)
    p.add_argument("--model", required=True,
                   help="Hugging Face folder, lmlab run dir, short name (minilm), or "
                        "random:PATH (same architecture, random weights)")
    p.add_argument("--random-init", action="store_true",
                   help="randomly initialise the model's architecture (pretrained vs random)")
    _common.add_out(p, "run directory", overwrite="start over in an --out folder that holds a "
                    "run or other files (default: rerunning on a run's folder resumes it from "
                    "its last checkpoint; other settings there are refused)")
    p.add_argument("--recipe", choices=("bert", "bert-paper", "scratch", "ulmfit", "feature"),
                   help="default: bert for a pretrained model, scratch for --random-init "
                        "(docs/finetuning.md: the recipes)")
    p.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    _common.add_flag(p, "budget", dest="budget_seconds",
                     help="training time limit per seed, e.g. 5m, 90s, 1h")
    p.add_argument("--config", help="YAML/JSON file with hparams: and speed: sections, any "
                                    "FinetuneConfig setting (flags override it)")
    p.add_argument("--save-every", type=int,
                   help="checkpoint every N optimizer steps (default: every epoch)")
    p.add_argument("--patience", type=int,
                   help="early stopping: epochs without a better dev score (default: the "
                        "recipe's: 3; ulmfit and bert-paper 2)")
    _common.add_flags(p, "epochs", "lr", "batch_size", "max_train_examples", "min_updates",
                      device=None)
    _common.add_flag(p, "precision", default=None, help=_common.AUTO_PRECISION_HELP)
    _common.add_flag(p, "activation_checkpointing")
    _common.add_flag(p, "max_length", help="tokens per sequence (default 128)")
    p.add_argument("--layer", type=int,
                   help="feature recipe: hidden state to use (-1 = last); default: scalar mix")
    p.add_argument("--pooling", choices=("auto", "family", "cls", "mean", "concat"),
                   help="sentence representation (default: the recipe's; bert: auto = the "
                        "checkpoint's own, mean for sentence-transformers models)")
    p.add_argument("--head-lr-multiplier", type=float,
                   help="the new task head trains at --lr times this (default: the recipe's; "
                        "bert 10)")
    p.add_argument("--head-hidden", type=int,
                   help="a batch-norm layer of this many units before the classifier, with "
                        "mean or concat pooling (ULMFiT's head: 50)")
    add_method_arguments(p)

    p = commands.command(
        "evaluate", help="score a fine-tuned model on a task's splits (predictions, metrics, "
        "confusion matrix), or a causal LM few-shot",
        example="lmlab evaluate --task wordnet-supersense --model runs/ss",
        handler=_evaluate)
    add_task_arguments(p)
    p.add_argument("--model", required=True,
                   help="a fine-tuning run dir (all its seed-N/: median and spread) or a folder "
                        "with a head")
    p.add_argument("--splits", default="dev", help="comma-separated splits (default dev)")
    _common.add_out(p, "where to write results (default: the run dir)", required=False)
    _common.add_flag(p, "precision", default="fp32", help=None,
                     choices=[p for p in PRECISIONS if p != "auto"])
    p.add_argument("--few-shot", help="causal LMs: comma-separated shot counts, e.g. 0,1,8")
    p.add_argument("--max-examples", type=int, default=100,
                   help="--few-shot: score N examples of each split, a stable label-stratified "
                        "sample (default 100; 0 = all)")
    _common.add_flag(p, "seed", help="--few-shot: the draw of the shots")
    _common.add_flags(p, "calibrate")
    _common.add_flag(p, "json", help="--few-shot: one JSON line per split")


#: --option -> (method, option name) of lmlab.adapt's methods
METHOD_OPTIONS = {"lora_r": ("lora", "r"), "lora_alpha": ("lora", "alpha"),
                  "lora_dropout": ("lora", "dropout"), "lora_targets": ("lora", "targets"),
                  "adapter_size": ("adapter", "bottleneck"),
                  "virtual_tokens": (("prompt", "prefix"), "num_virtual_tokens")}


def add_method_arguments(p) -> None:
    """--method and its options (docs/adaptation.md)."""
    p.add_argument("--method", choices=("lora", "adapter", "bitfit", "prompt", "prefix"),
                   help="parameter-efficient fine-tuning: train only LoRA updates, bottleneck "
                        "adapters, the biases, a soft prompt or per-layer prefixes (and the "
                        "task head); model/ then holds a small adapter file")
    p.add_argument("--lora-r", type=int, help="LoRA rank (default 8)")
    p.add_argument("--lora-alpha", type=float, help="LoRA scale numerator (default 16)")
    p.add_argument("--lora-dropout", type=float, help="dropout on LoRA's input (default 0)")
    p.add_argument("--lora-targets", help="comma-separated projections (default q_proj,v_proj; "
                                          "also k_proj, o_proj, up_proj, down_proj, gate_proj)")
    p.add_argument("--adapter-size", type=int, help="adapter bottleneck width (default 64)")
    p.add_argument("--virtual-tokens", type=int,
                   help="prompt/prefix: number of virtual tokens (default 20)")


def method_options(args: argparse.Namespace) -> dict:
    """The options given for ``--method``; one meant for another method is refused."""
    from lmlab.utils.errors import LmlabError

    options = {}
    for attribute, (methods, name) in METHOD_OPTIONS.items():
        value = getattr(args, attribute, None)
        if value is None:
            continue
        flag = "--" + attribute.replace("_", "-")
        if args.method not in ((methods,) if isinstance(methods, str) else methods):
            raise LmlabError(f"{flag} is an option of --method "
                             f"{methods if isinstance(methods, str) else ' or '.join(methods)}",
                             f"add that --method, or drop {flag}")
        options[name] = tuple(value.split(",")) if name == "targets" else value
    return options


def config_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The flags that are :class:`FinetuneConfig` settings (by dest) for its ``from_sections``;
    a switch not given is None, so a --config file's value stands."""
    from lmlab.finetune.settings import FinetuneConfig

    return {f.name: None if getattr(args, f.name) is False else getattr(args, f.name)
            for f in fields(FinetuneConfig) if hasattr(args, f.name)}


def check_finetune_args(args: argparse.Namespace):
    """The seeds and the :class:`FinetuneConfig` (flags over the --config file, checked), the
    model and (several seeds) the --out folder, before any work. One run's folder is checked
    by the library (resume, refuse, start over)."""
    from pathlib import Path

    from lmlab.finetune.settings import FinetuneConfig
    from lmlab.training.config import load_config_file
    from lmlab.utils.checks import check_output_folder, parse_int_list
    from lmlab.utils.errors import LmlabError
    from lmlab.utils.io import read_json

    seeds = parse_int_list(args.seeds, "--seeds")
    sections = load_config_file(args.config) if args.config else {}
    speed = {"precision": "auto", **(sections.get("speed") or {})}  # the command's default
    config = FinetuneConfig.from_sections({**sections, "speed": speed}, **config_flags(args),
                                          method_options=method_options(args) or None)
    if len(seeds) > 1:  # seed-N/ folders are runs: resumed or refused one by one
        check_output_folder(Path(args.out), args.overwrite, "fine-tuning run",
                            ignore=("seed-*", "summary.json"))
    from lmlab.utils.catalog import resolve_model_dir  # imports torch: after the cheap checks

    source = resolve_model_dir(str(args.model).removeprefix("random:"))
    config_file = source / "config.json"
    if config.max_length and config_file.is_file():
        positions = read_json(config_file).get("max_position_embeddings")
        if positions and config.max_length > positions:
            raise LmlabError(f"--max-length {config.max_length} exceeds the model's {positions} "
                             "positions", f"use --max-length {positions} or less")
    return seeds, config


def _finetune(args: argparse.Namespace) -> int:
    import json
    import os

    seeds, config = check_finetune_args(args)
    task = task_from_args(args, required=("train", "dev"))
    from lmlab.finetune.runner import finetune, finetune_seeds

    reports = os.environ.get("RANK", "0") == "0"  # under torchrun, rank 0 reports
    if len(seeds) == 1:
        result = finetune(task, args.model, args.out, config=config, seed=seeds[0])
        if not reports:
            return 0
        print(json.dumps({k: result.get(k) for k in ("dev", "test", "best_epoch", "stop_reason",
                                                     "precision", "precision_reason")}, indent=2))
    else:
        summary = finetune_seeds(task, args.model, args.out, seeds, config=config)
        if not reports:
            return 0
        for split in ("dev", "test"):
            for name, stats in summary[split].items():
                print(f"{split} {name}: median {stats['median']:.4f}  spread "
                      f"{stats['spread']:.4f}  (n={stats['n']})")
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    task = task_from_args(args)
    from lmlab.utils.checks import check_at_least

    check_at_least(args.max_examples, 0, "--max-examples")
    splits = tuple(s for s in args.splits.split(",") if s)
    for split in splits:
        task.split(split)  # an unknown split is refused before the model loads
    if args.few_shot:
        from lmlab.evaluation.lm import parse_shot_counts
        from lmlab.load import from_pretrained
        from lmlab.tokenization.tokenizer import Tokenizer

        shots = parse_shot_counts(args.few_shot)
        model = from_pretrained(args.model)
        tokenizer = Tokenizer.from_pretrained(args.model)
        _common.print_few_shot(model, tokenizer, task, shots, splits, args)
        return 0
    from lmlab.finetune.runner import evaluate

    out = Path(args.out) if args.out else Path(args.model)
    result = evaluate(task, args.model, out, splits, precision=args.precision)
    print(json.dumps(result, indent=2))
    return 0
