"""``lmlab distil`` (DistilBERT's task-agnostic distillation on token shards) and
``lmlab distil-task`` (fine-tuning a student with a fine-tuned teacher's soft targets):
docs/distillation.md."""

from __future__ import annotations

import argparse
from pathlib import Path

from lmlab.cli import _common

# the pretraining flags `lmlab distil` passes on to PretrainConfig
_TRAINING_FLAGS = ("shards", "out", "seq_len", "batch_size", "lr", "warmup", "schedule",
                   "weight_decay", "clip_norm", "steps", "tokens", "budget", "seed", "grad_accum",
                   "eval_every", "eval_batches", "save_every", "keep_last", "log_every",
                   "precision", "threads", "device", "tokenizer", "overwrite")


def register(commands) -> None:
    p = commands.command(
        "distil", help="distil a teacher into a student of some of its layers on token shards "
                       "(DistilBERT: soft targets, masked LM, hidden-state cosine)",
        example="lmlab distil --teacher minilm --student-layers 3 --shards shards/ "
                "--alpha-ce 0 --budget 10m --out runs/distil",
        handler=_distil,
        description="Task-agnostic distillation (Sanh et al. 2019). The student is the "
                    "teacher's embeddings and --student-layers of its layers (spread as "
                    "DistilBERT's 0,2,4,7,9,11 of 12), trained on the shards with "
                    "alpha_ce * T^2 * KL(teacher || student) + alpha_mlm * MLM + alpha_cos * "
                    "(1 - cos) of the last hidden states. The run directory is a pretraining "
                    "run's (model/ is the student); rerunning on --out resumes it.")
    p.add_argument("--teacher", required=True,
                   help="model folder, lmlab run directory or short name (minilm)")
    p.add_argument("--student-layers", type=int,
                   help="layers of the student (default: half the teacher's)")
    p.add_argument("--layers", help="the teacher layers to copy, comma-separated (e.g. 0,2,5; "
                                    "default: spread from the first to the last)")
    p.add_argument("--temperature", type=float, default=2.0,
                   help="softmax temperature of the soft targets (default 2)")
    p.add_argument("--alpha-ce", type=float, default=5.0,
                   help="weight of the soft-target KL (default 5; needs a teacher with an MLM "
                        "head: 0 for sentence encoders such as minilm)")
    p.add_argument("--alpha-mlm", type=float, default=2.0,
                   help="weight of the masked-LM loss (default 2)")
    p.add_argument("--alpha-cos", type=float, default=1.0,
                   help="weight of the hidden-state cosine loss (default 1)")
    p.add_argument("--restrict-ce-to-mask", action="store_true",
                   help="soft targets at the masked positions only (default: every real token)")
    p.add_argument("--shards", required=True, help="token-shard folder (from `lmlab data "
                                                   "tokenize --tokenizer TEACHER`)")
    _common.add_out(p, "run directory (resumed when it has checkpoints)")
    _common.add_training_flags(p)
    _common.add_precision(p, help=_common.AUTO_PRECISION_HELP)
    _common.add_threads(p)
    _common.add_device(p, None, "auto | cpu | cuda")
    p.add_argument("--tokenizer", help="tokenizer folder (default: the one the shards record)")
    p.add_argument("--no-cost", action="store_true", help="do not track FLOPs/energy/cost")
    _common.add_overwrite(p, "start a run that is in --out over instead of resuming it")

    t = commands.command(
        "distil-task", help="fine-tune a student on a task with a fine-tuned teacher's soft "
                            "targets (task-specific distillation)",
        example="lmlab distil-task --task wordnet-wic --teacher runs/wic-minilm "
                "--student runs/distil --out runs/wic-student",
        handler=_distil_task,
        description="Fine-tunes --student as `lmlab finetune` does (bert recipe, dev "
                    "selection, checkpoints) with the loss alpha * T^2 * KL(teacher || "
                    "student) + (1 - alpha) * label loss; the teacher's logits are computed "
                    "once per training example.")
    from lmlab.cli._task_options import add_task_arguments

    add_task_arguments(t)
    t.add_argument("--teacher", required=True, help="a model fine-tuned on this task (its run "
                                                    "directory or model folder)")
    t.add_argument("--student", required=True,
                   help="the model to fine-tune (e.g. the run directory of `lmlab distil`)")
    _common.add_out(t, "run directory")
    t.add_argument("--distil-alpha", type=float, default=0.5,
                   help="weight of the soft targets; 1 - alpha goes to the labels (default 0.5)")
    t.add_argument("--temperature", type=float, default=2.0, help="softmax temperature (2)")
    _common.add_seed(t)
    t.add_argument("--epochs", type=int)
    _common.add_lr(t)
    _common.add_batch_size(t)
    _common.add_max_length(t, help="tokens per sequence (default 128)")
    _common.add_max_train_examples(t)
    t.add_argument("--min-updates", type=int,
                   help="train at least N optimizer updates (default: the recipe's)")
    t.add_argument("--budget", help="training time limit, e.g. 5m")
    _common.add_precision(t)
    _common.add_device(t, help=None)
    _common.add_overwrite(t, "start over in an --out folder that holds a run")


def _layers(text: str | None) -> tuple[int, ...] | None:
    from lmlab.utils.checks import parse_int_list

    return None if text is None else parse_int_list(text, "--layers", "0,2,5")


def _distil(args: argparse.Namespace) -> int:
    """Flags -> DistilSettings + PretrainConfig -> lmlab.compress.distil.distil; the summary."""
    import os

    from lmlab.compress.distil import DistilSettings, distil
    from lmlab.training.pretrain import PretrainConfig

    settings = DistilSettings(args.teacher, args.student_layers, _layers(args.layers),
                              args.temperature, args.alpha_ce, args.alpha_mlm, args.alpha_cos,
                              args.restrict_ce_to_mask)
    flags = {_common.SETTING_OF_FLAG.get(k, k): getattr(args, k) for k in _TRAINING_FLAGS}
    config = PretrainConfig.from_sections(None, track_cost=not args.no_cost, **flags)
    result = distil(settings, config)
    if int(os.environ.get("RANK", 0)) != 0:
        return 0
    out = Path(args.out)
    _common.print_run_summary(result, "lmlab distil")
    print(f"lmlab distil: report {out / 'report.md'}; student {out / 'model'}")
    return 0


def _distil_task(args: argparse.Namespace) -> int:
    """Flags -> lmlab.finetune.finetune(distil=TaskDistillation(...)); the dev/test scores."""
    from lmlab.cli._task_options import task_from_args
    from lmlab.cli.finetune import parse_budget
    from lmlab.compress.distil import TaskDistillation
    from lmlab.finetune.runner import finetune

    task = task_from_args(args, required=("train", "dev"))
    result = finetune(task, args.student, args.out, recipe="bert", seed=args.seed,
                      epochs=args.epochs, lr=args.lr, batch_size=args.batch_size,
                      max_train_examples=args.max_train_examples,
                      budget_seconds=parse_budget(args.budget),
                      precision=args.precision, max_length=args.max_length,
                      device=args.device, overwrite=args.overwrite,
                      min_updates=args.min_updates,
                      distil=TaskDistillation(args.teacher, args.distil_alpha, args.temperature))
    for split in ("dev", "test"):
        if split in result:
            print(f"lmlab distil-task: {split} " + ", ".join(
                f"{k}={v:.4g}" for k, v in result[split].items() if isinstance(v, float)))
    print(f"lmlab distil-task: student {Path(args.out) / 'model'}")
    return 0
