"""``lmlab distil`` (DistilBERT's task-agnostic distillation on token shards) and
``lmlab distil-task`` (fine-tuning a student with a fine-tuned teacher's soft targets):
docs/distillation.md."""

from __future__ import annotations

import argparse
from pathlib import Path

from lmlab.cli import _common
from lmlab.utils.checks import parse_int_list


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
    p.add_argument("--layers", type=lambda text: parse_int_list(text, "--layers", "0,2,5"),
                   help="the teacher layers to copy, comma-separated (e.g. 0,2,5; "
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
    _common.add_flags(t, "seed", "epochs", "lr", "batch_size", "max_train_examples",
                      "min_updates", "precision", "device")
    _common.add_flag(t, "budget", dest="budget_seconds")
    _common.add_flag(t, "max_length", help="tokens per sequence (default 128)")
    _common.add_overwrite(t, "start over in an --out folder that holds a run")


def _distil(args: argparse.Namespace) -> int:
    """Flags -> DistilSettings + PretrainConfig -> lmlab.compress.distil.distil; the summary."""
    import os
    from dataclasses import fields

    from lmlab.compress.distil import DistilSettings, distil

    own = [field.name for field in fields(DistilSettings)]  # the other flags: PretrainConfig's
    result = distil(_common.settings_from(DistilSettings, args),
                    _common.pretrain_config(args, *own))
    if int(os.environ.get("RANK", 0)) != 0:
        return 0
    out = Path(args.out)
    _common.print_run_summary(result, "lmlab distil")
    print(f"lmlab distil: report {out / 'report.md'}; student {out / 'model'}")
    return 0


def _distil_task(args: argparse.Namespace) -> int:
    """Flags -> lmlab.finetune.finetune(distil=TaskDistillation(...)); the dev/test scores."""
    from lmlab.cli._task_options import task_from_args
    from lmlab.cli.finetune import config_flags
    from lmlab.compress.distil import TaskDistillation
    from lmlab.finetune.runner import finetune
    from lmlab.finetune.settings import FinetuneConfig

    task = task_from_args(args, required=("train", "dev"))
    config = FinetuneConfig.from_sections(
        None, recipe="bert", **config_flags(args),
        distil=TaskDistillation(args.teacher, args.distil_alpha, args.temperature))
    result = finetune(task, args.student, args.out, config=config)
    for split in ("dev", "test"):
        if split in result:
            print(f"lmlab distil-task: {split} " + ", ".join(
                f"{k}={v:.4g}" for k, v in result[split].items() if isinstance(v, float)))
    print(f"lmlab distil-task: student {Path(args.out) / 'model'}")
    return 0
