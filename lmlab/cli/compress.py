"""``lmlab compress prune-heads | magnitude | lottery | low-rank``: pruning and low-rank
factorisation of a model, each with its curve or report (docs/pruning.md)."""

from __future__ import annotations

import argparse
import sys

from lmlab.cli._task_options import add_task_arguments

GROUP = "compress"


def register(commands) -> None:
    p = commands.command(
        "prune-heads", group=GROUP,
        help="remove attention heads in order of Michel et al.'s importance, evaluating the "
             "task after each step (accuracy against heads removed; the pruned model is saved)",
        example="lmlab compress prune-heads minilm --task wordnet-supersense --finetune-steps "
                "200 --step 0.1 --max 0.5 --out pruned-heads",
        handler=_prune_heads)
    _common(p, task_required=True)
    p.add_argument("--step", type=float, default=0.1,
                   help="fraction of the heads removed per step (default 0.1)")
    p.add_argument("--max", type=float, default=0.5, dest="max_fraction",
                   help="stop once this fraction of the heads is removed; the model at that "
                        "point is saved (default 0.5)")
    p.add_argument("--importance-split", default="dev",
                   help="split whose examples score the heads (default dev, as Michel et al.)")
    p.add_argument("--importance-examples", type=int, default=256,
                   help="examples scoring the heads at each step (default 256)")
    p.add_argument("--no-recompute", action="store_true",
                   help="score the heads once, not after every step")
    p.add_argument("--finetune-steps", type=int, default=0,
                   help="first fine-tune a model without the task's head for this many steps")

    p = commands.command(
        "magnitude", group=GROUP,
        help="unstructured magnitude pruning (global or per matrix) to each sparsity, during "
             "fine-tuning with a cubic or linear schedule, or in one shot (--steps 0)",
        example="lmlab compress magnitude RUN/model --task wordnet-supersense --sparsity "
                "0.3,0.6,0.9 --steps 0 --out magnitude",
        handler=_magnitude)
    _common(p, task_required=True)
    p.add_argument("--sparsity", default="0.5",
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
        handler=_lottery)
    _common(p, task_required=True)
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
        handler=_low_rank)
    _common(p, task_required=False)
    p.add_argument("--rank", type=int, help="one rank for every matrix")
    p.add_argument("--energy", type=float,
                   help="per matrix, the smallest rank keeping this fraction of sum s_i^2")
    p.add_argument("--modules", default="",
                   help="comma-separated module names to factorise (q_proj, k_proj, v_proj, "
                        "o_proj, up_proj, down_proj; default all)")


def _common(p: argparse.ArgumentParser, task_required: bool) -> None:
    p.add_argument("model", help="model folder, run directory or short name (minilm)")
    p.add_argument("--out", required=True, help="output folder (results, curve, model/)")
    p.add_argument("--overwrite", action="store_true", help="write into an --out that has files")
    p.add_argument("--eval-split", default="dev", help="split the metric is measured on")
    p.add_argument("--eval-examples", type=int, default=None,
                   help="measure the metric on this many examples of the split (a stratified "
                        "sample, the same at every step; default all)")
    p.add_argument("--max-length", type=int, default=128)
    if task_required:
        add_task_arguments(p)
    else:
        p.add_argument("--task", help="a task to evaluate before and after (optional)")
        p.add_argument("--size", default="cpu", choices=("cpu", "full"))


def _training(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-train-examples", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)


def _fraction(value: float, option: str, allow_zero: bool = False) -> None:
    from lmlab.utils.errors import LmlabError

    if not ((0 <= value if allow_zero else 0 < value) and value < 1):
        raise LmlabError(f"{option} {value} is outside {'[0' if allow_zero else '(0'}, 1)",
                         f"give {option} as a fraction, e.g. 0.2")


def _start(args: argparse.Namespace, what: str):
    """Check the output folder, then load the task (if any), the model and its tokenizer."""
    from pathlib import Path

    from lmlab.utils.checks import check_at_least, check_output_folder

    check_at_least(args.eval_examples, 1, "--eval-examples")
    out = Path(args.out)
    check_output_folder(out, args.overwrite, what, ignore=(".*.tmp",))
    task = None
    if getattr(args, "task", None):
        if hasattr(args, "glue_dir"):
            from lmlab.cli._task_options import task_from_args

            task = task_from_args(args)
        else:
            from lmlab.tasks import load_builtin_task

            task = load_builtin_task(args.task, size=args.size)
        task.split(args.eval_split)  # an unknown split is refused before any training
        if getattr(args, "importance_split", None):
            task.split(args.importance_split)
        if getattr(args, "steps", 0) or getattr(args, "finetune_steps", 0):
            task.split("train")
    from lmlab.finetune.runner import load_model

    model, tokenizer, _ = load_model(args.model)
    return out, task, model, tokenizer


def _fresh(folder):
    """A training folder of this command, emptied first: under --overwrite an earlier run's
    checkpoint there would be resumed (train_on_task refuses one)."""
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    return folder


def _has_head(model, task) -> bool:
    from lmlab.models.task_heads import HEAD_FOR_TASK
    from lmlab.finetune.runner import check_head_matches

    if HEAD_FOR_TASK[task.type] not in model.heads:
        return False
    check_head_matches(model, task)
    return True


def _results(args: argparse.Namespace, title: str, **values):
    from lmlab.utils.host import describe_host

    command = "lmlab " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["compress"] else ""
    return {"title": title, "model": str(args.model), "host": describe_host(),
            "command": command, **values}


def _prune_heads(args: argparse.Namespace) -> int:
    from lmlab.utils.checks import check_at_least
    from lmlab.utils.errors import LmlabError

    _fraction(args.step, "--step")
    _fraction(args.max_fraction, "--max")
    check_at_least(args.importance_examples, 1, "--importance-examples")
    check_at_least(args.finetune_steps, 0, "--finetune-steps")
    out, task, model, tokenizer = _start(args, "head-pruning results")
    from lmlab.compress.heads import (
        attention_modules,
        head_importance,
        iterative_head_pruning,
        task_batches,
        task_loss,
    )
    from lmlab.compress.magnitude import task_metric, train_on_task

    attention_modules(model)  # refuse a model whose heads cannot be pruned, before training
    if not _has_head(model, task):
        if not args.finetune_steps:
            raise LmlabError(f"{args.model} has no head for the task {task.name}: the heads "
                             "would be scored against a random classifier",
                             "fine-tune it first (lmlab finetune) or add --finetune-steps N")
        train_on_task(model, tokenizer, task, _fresh(out / "finetune"), args.finetune_steps,
                      max_length=args.max_length, progress=True)
    batches = task_batches(task, tokenizer, args.importance_split, args.importance_examples,
                           max_length=args.max_length)
    loss = task_loss(task)
    evaluate = task_metric(task, tokenizer, args.eval_split, args.max_length,
                           args.eval_examples)

    def show(row):
        print(f"removed {row['heads_removed']:3d} heads ({100 * row['fraction_removed']:.0f}%): "
              f"{task.metrics[0]} {row['metric']:.4f}", flush=True)

    rows = iterative_head_pruning(model, lambda m: head_importance(m, batches, loss),
                                  evaluate, args.step, args.max_fraction,
                                  recompute=not args.no_recompute, on_step=show)
    from lmlab.compress.pruning_report import write_run

    results = _results(args, f"Head pruning on {task.name}", task=task.name,
                       metric=task.metrics[0], split=args.eval_split,
                       eval_examples=args.eval_examples, steps=rows,
                       finetune_steps=args.finetune_steps)
    written = write_run(out, results, rows, [
        ("heads_removed", "heads removed"), ("fraction_removed", "fraction"),
        ("metric", f"{args.eval_split} {task.metrics[0]}"), ("parameters", "parameters"),
        ("heads_per_layer", "heads per layer")], model, tokenizer,
        {"x": "fraction_removed", "xlabel": "attention heads removed (%)",
         "ylabel": f"{args.eval_split} {task.metrics[0]}",
         "title": f"{args.model} on {task.name}: iterative head pruning"})
    print(f"wrote {', '.join(str(p) for p in written)}")
    return 0


def _parse_fractions(text: str, option: str) -> list[float]:
    from lmlab.utils.errors import LmlabError

    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError as error:
        raise LmlabError(f"{option} {text!r} is not a list of numbers",
                         f"e.g. {option} 0.3,0.6,0.9") from error
    if not values:
        raise LmlabError(f"{option} is empty", f"e.g. {option} 0.5")
    for value in values:
        _fraction(value, option, allow_zero=True)
    return values


def _magnitude(args: argparse.Namespace) -> int:
    import copy

    from lmlab.utils.checks import check_at_least
    from lmlab.utils.errors import LmlabError

    sparsities = _parse_fractions(args.sparsity, "--sparsity")
    check_at_least(args.steps, 0, "--steps")
    check_at_least(args.every, 1, "--every")
    out, task, model, tokenizer = _start(args, "magnitude-pruning results")
    from lmlab.compress.magnitude import (
        MagnitudePruningHook,
        apply_masks,
        magnitude_masks,
        prunable_linears,
        sparsity_of,
        task_metric,
        train_on_task,
    )

    if not args.steps and not _has_head(model, task):
        raise LmlabError(f"{args.model} has no head for the task {task.name}; one-shot pruning "
                         "(--steps 0) needs a fine-tuned model",
                         "fine-tune it first (lmlab finetune), or prune while fine-tuning "
                         "(--steps N)")
    evaluate = task_metric(task, tokenizer, args.eval_split, args.max_length,
                           args.eval_examples)
    rows, pruned = [], model
    for index, target in enumerate(sparsities):
        pruned = copy.deepcopy(model)
        if args.steps:
            hook = MagnitudePruningHook(pruned, target, start=args.steps // 10,
                                        end=max(args.steps // 10, (7 * args.steps) // 10),
                                        every=args.every, scope=args.scope, kind=args.schedule)
            train_on_task(pruned, tokenizer, task, _fresh(out / f"train-{index}"), args.steps,
                          [hook], lr=args.lr, batch_size=args.batch_size,
                          max_length=args.max_length, seed=args.seed,
                          max_train_examples=args.max_train_examples)
        else:
            modules = prunable_linears(pruned)
            apply_masks(modules, magnitude_masks(modules, target, args.scope))
        row = {"target": target, "sparsity": sparsity_of(prunable_linears(pruned)),
               "metric": evaluate(pruned)}
        print(f"sparsity {row['sparsity']:.3f}: {task.metrics[0]} {row['metric']:.4f}", flush=True)
        rows.append(row)
    from lmlab.compress.pruning_report import write_run

    how = f"{args.steps} steps, {args.schedule} schedule" if args.steps else "one shot"
    results = _results(args, f"Magnitude pruning on {task.name} ({args.scope}, {how})",
                       task=task.name, metric=task.metrics[0], split=args.eval_split,
                       scope=args.scope, schedule=args.schedule, steps=args.steps, rows=rows)
    written = write_run(out, results, rows, [
        ("target", "target sparsity"), ("sparsity", "sparsity"),
        ("metric", f"{args.eval_split} {task.metrics[0]}")], pruned, tokenizer,
        {"x": "sparsity", "xlabel": "weights removed (%)",
         "ylabel": f"{args.eval_split} {task.metrics[0]}", "title": results["title"]})
    print(f"wrote {', '.join(str(p) for p in written)}")
    return 0


def _lottery(args: argparse.Namespace) -> int:
    from lmlab.utils.checks import check_at_least

    check_at_least(args.rounds, 1, "--rounds")
    check_at_least(args.steps, 1, "--steps")
    check_at_least(args.rewind_step, 0, "--rewind-step")
    _fraction(args.prune_fraction, "--prune-fraction")
    if args.rewind_step >= args.steps:
        from lmlab.utils.errors import LmlabError

        raise LmlabError(f"--rewind-step {args.rewind_step} is not before the end of training "
                         f"(--steps {args.steps})", "rewind to an early step, e.g. 5% of --steps")
    out, task, model, tokenizer = _start(args, "lottery-ticket results")
    from lmlab.compress.magnitude import lottery_ticket, task_metric, train_on_task

    def train(m, hooks, round_):
        train_on_task(m, tokenizer, task, _fresh(out / f"round-{round_}"), args.steps, hooks,
                      lr=args.lr, batch_size=args.batch_size, max_length=args.max_length,
                      seed=args.seed, max_train_examples=args.max_train_examples)

    def show(row):
        print(f"round {row['round']}: sparsity {row['sparsity']:.3f}, {task.metrics[0]} "
              f"{row['metric']:.4f}", flush=True)

    rows = lottery_ticket(model, train, task_metric(task, tokenizer, args.eval_split,
                                                    args.max_length, args.eval_examples),
                          args.rounds, args.prune_fraction, args.rewind_step, args.scope, show)
    from lmlab.compress.pruning_report import write_run

    results = _results(args, f"Lottery ticket on {task.name} (rewind to step "
                             f"{args.rewind_step}, {args.prune_fraction:.0%} per round)",
                       task=task.name, metric=task.metrics[0], split=args.eval_split,
                       rounds=rows, steps_per_round=args.steps)
    written = write_run(out, results, rows, [
        ("round", "round"), ("sparsity", "sparsity"),
        ("metric", f"{args.eval_split} {task.metrics[0]}")], model, tokenizer,
        {"x": "sparsity", "xlabel": "weights removed (%)",
         "ylabel": f"{args.eval_split} {task.metrics[0]}", "title": results["title"]})
    print(f"wrote {', '.join(str(p) for p in written)}")
    return 0


def _low_rank(args: argparse.Namespace) -> int:
    from lmlab.utils.errors import LmlabError

    if (args.rank is None) == (args.energy is None):
        raise LmlabError("give exactly one of --rank and --energy", "e.g. --energy 0.9")
    if args.rank is not None and args.rank < 1:
        raise LmlabError(f"--rank {args.rank}", "give a rank of at least 1")
    if args.energy is not None and not 0 < args.energy <= 1:
        raise LmlabError(f"--energy {args.energy} is outside (0, 1]", "e.g. --energy 0.9")
    out, task, model, tokenizer = _start(args, "low-rank results")
    from lmlab.compress.lowrank import low_rank, select_linears, summary

    modules = [m.strip() for m in args.modules.split(",") if m.strip()] or None
    select_linears(model, modules)  # refuse unknown names before the first evaluation
    evaluate = None
    before = None
    if task is not None:
        from lmlab.compress.magnitude import task_metric

        if not _has_head(model, task):
            raise LmlabError(f"{args.model} has no head for the task {task.name}",
                             "fine-tune it first (lmlab finetune), or leave out --task")
        evaluate = task_metric(task, tokenizer, args.eval_split, args.max_length,
                           args.eval_examples)
        before = evaluate(model)
    rows = low_rank(model, rank=args.rank, energy=args.energy, modules=modules)
    report = summary(rows, model)
    if evaluate is not None:
        report.update(metric_before=before, metric_after=evaluate(model),
                      metric=task.metrics[0])
    for key, value in report.items():
        print(f"{key}: {value}")
    from lmlab.compress.pruning_report import write_run

    results = _results(args, "Low-rank factorisation (truncated SVD)", rank=args.rank,
                       energy=args.energy, summary=report, modules=[r.to_dict() for r in rows])
    written = write_run(out, results, [r.to_dict() for r in rows], [
        ("name", "module"), ("in_features", "in"), ("out_features", "out"), ("rank", "rank"),
        ("parameters_before", "weights before"), ("parameters_after", "weights after"),
        ("relative_error", "relative error"), ("energy", "energy kept")], model, tokenizer)
    print(f"wrote {', '.join(str(p) for p in written)}")
    return 0
