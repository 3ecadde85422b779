"""``lmlab compress prune-heads | magnitude | lottery | low-rank``: the jobs of
:mod:`lmlab.compress.jobs`, each with its curve or report (docs/pruning.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lmlab.cli import _common
from lmlab.cli._task_options import add_task_arguments
from lmlab.compress.settings import parse_fractions

GROUP = "compress"


def register(commands) -> None:
    p = commands.command(
        "prune-heads", group=GROUP,
        help="remove attention heads in order of Michel et al.'s importance, evaluating the "
             "task after each step (accuracy against heads removed; the pruned model is saved)",
        example="lmlab compress prune-heads minilm --task wordnet-supersense --finetune-steps "
                "200 --step 0.1 --max 0.5 --out pruned-heads",
        handler=_run)
    _add_job_flags(p, "prune-heads", task_required=True)
    p.add_argument("--step", type=float, default=0.1,
                   help="fraction of the heads removed per step (default 0.1)")
    p.add_argument("--max", type=float, default=0.5, dest="max_fraction",
                   help="stop once this fraction of the heads is removed; the model at that "
                        "point is saved (default 0.5)")
    p.add_argument("--importance-split", default="dev",
                   help="split whose examples score the heads (default dev, as Michel et al.)")
    p.add_argument("--importance-examples", type=int, default=256,
                   help="examples scoring the heads at each step (default 256)")
    p.add_argument("--no-recompute", action="store_false", dest="recompute",
                   help="score the heads once, not after every step")
    p.add_argument("--finetune-steps", type=int, default=0,
                   help="first fine-tune a model without the task's head for this many steps")

    p = commands.command(
        "magnitude", group=GROUP,
        help="unstructured magnitude pruning (global or per matrix) to each sparsity, during "
             "fine-tuning with a cubic or linear schedule, or in one shot (--steps 0)",
        example="lmlab compress magnitude RUN/model --task wordnet-supersense --sparsity "
                "0.3,0.6,0.9 --steps 0 --out magnitude",
        handler=_run)
    _add_job_flags(p, "magnitude", task_required=True)
    p.add_argument("--sparsity", default="0.5", dest="sparsities",
                   type=lambda text: parse_fractions(text, "--sparsity"),
                   help="comma-separated target sparsities (fractions of the layers' linear "
                        "weights set to 0); the model of the last one is saved")
    p.add_argument("--scope", choices=("global", "layer"), default="global")
    p.add_argument("--schedule", choices=("cubic", "linear"), default="cubic")
    p.add_argument("--steps", type=int, default=0,
                   help="fine-tuning steps during which the sparsity rises from 10%% to 70%% "
                        "of the run (0 = prune the trained weights in one shot)")
    p.add_argument("--every", type=int, default=10, help="steps between mask updates")
    _training(p)

    p = commands.command(
        "lottery", group=GROUP,
        help="the lottery ticket procedure: train, prune a fraction of the surviving weights, "
             "rewind the survivors to step k, retrain; accuracy against sparsity",
        example="lmlab compress lottery minilm --task wordnet-supersense --rounds 3 --steps 200 "
                "--rewind-step 20 --out lottery",
        handler=_run)
    _add_job_flags(p, "lottery", task_required=True)
    p.add_argument("--rounds", type=int, default=3, help="pruning rounds (default 3)")
    p.add_argument("--prune-fraction", type=float, default=0.2,
                   help="fraction of the surviving weights removed each round (default 0.2)")
    p.add_argument("--rewind-step", type=int, default=0,
                   help="optimizer step whose weights the survivors return to (0 = the "
                        "starting weights; Frankle et al. 2020 rewind to an early step)")
    p.add_argument("--scope", choices=("global", "layer"), default="global")
    p.add_argument("--steps", type=int, default=200, help="training steps per round")
    _training(p)

    p = commands.command(
        "low-rank", group=GROUP,
        help="factorise the layers' linear maps by truncated SVD (a rank, or the energy kept); "
             "reports the weights and FLOPs removed and the reconstruction error",
        example="lmlab compress low-rank minilm --energy 0.9 --out minilm-low-rank",
        handler=_run)
    _add_job_flags(p, "low-rank", task_required=False)
    p.add_argument("--rank", type=int, help="one rank for every matrix")
    p.add_argument("--energy", type=float,
                   help="per matrix, the smallest rank keeping this fraction of sum s_i^2")
    p.add_argument("--modules", default="", type=lambda text: tuple(
                       m.strip() for m in text.split(",") if m.strip()) or None,
                   help="comma-separated module names to factorise (q_proj, k_proj, v_proj, "
                        "o_proj, up_proj, down_proj; default all)")


def _add_job_flags(p: argparse.ArgumentParser, job: str, task_required: bool) -> None:
    p.set_defaults(job=job)
    _common.add_model(p, "model folder, run directory or short name (minilm)")
    _common.add_out(p, "output folder (results, curve, model/)",
            overwrite="write into an --out that has files")
    p.add_argument("--eval-split", default="dev", help="split the metric is measured on")
    p.add_argument("--eval-examples", type=int, default=None,
                   help="measure the metric on this many examples of the split (a stratified "
                        "sample, the same at every step; default all)")
    _common.add_flags(p, max_length=128)
    if task_required:
        add_task_arguments(p)
    else:
        p.add_argument("--task", help="a task to evaluate before and after (optional)")
        p.add_argument("--size", default="cpu", choices=("cpu", "full"))


def _training(p: argparse.ArgumentParser) -> None:
    _common.add_flags(p, "max_train_examples", "seed", lr=5e-5, batch_size=32)


# command -> its settings in lmlab.compress.settings, its job in lmlab.compress.jobs, what
# it writes
JOBS = {"prune-heads": ("HeadPruning", "prune_heads_job", "head-pruning results"),
        "magnitude": ("MagnitudePruning", "magnitude_job", "magnitude-pruning results"),
        "lottery": ("Lottery", "lottery_job", "lottery-ticket results"),
        "low-rank": ("LowRank", "low_rank_job", "low-rank results")}


def _run(args: argparse.Namespace) -> int:
    """The command's settings and the ones every job shares from its flags (checked when
    made), the output folder checked, the task, model and tokenizer loaded; then the job."""
    from lmlab.compress import jobs
    from lmlab.compress import settings as job_settings
    from lmlab.utils.checks import check_output_folder

    kind, run, what = JOBS[args.job]
    settings = _common.settings_from(getattr(job_settings, kind), args)
    command = "lmlab " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["compress"] else ""
    job = _common.settings_from(jobs.JobSettings, args, out=Path(args.out),
                                source=str(args.model), command=command)
    check_output_folder(job.out, args.overwrite, what, ignore=(".*.tmp",))
    # the jobs that train: a fine-tuning run before head pruning, magnitude's, the lottery's
    training = bool(getattr(settings, "finetune_steps", 0) or getattr(settings, "steps", 0))
    task = _task(args, training)
    from lmlab.finetune.runner import load_model

    model, tokenizer, _ = load_model(args.model)
    paths = getattr(jobs, run)(model, tokenizer, task=task, job=job, settings=settings)
    print(f"wrote {', '.join(str(p) for p in paths)}")
    return 0


def _task(args: argparse.Namespace, training: bool):
    """The task (if any), its splits checked before any training."""
    if not getattr(args, "task", None):
        return None
    if hasattr(args, "glue_dir"):
        from lmlab.cli._task_options import task_from_args

        task = task_from_args(args)
    else:
        from lmlab.tasks import load_builtin_task

        task = load_builtin_task(args.task, size=args.size)
    task.split(args.eval_split)  # an unknown split is refused before any training
    if getattr(args, "importance_split", None):
        task.split(args.importance_split)
    if training:
        task.split("train")
    return task
