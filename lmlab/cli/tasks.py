"""``lmlab tasks list``, ``lmlab tasks export-texts`` and ``lmlab baseline``."""

from __future__ import annotations

import argparse

from lmlab.cli import _common


def register(commands) -> None:
    p = commands.command("list", help="list the built-in downstream tasks and their split sizes",
                         example="lmlab tasks list", handler=_list, group="tasks")
    _common.add_flag(p, "json", help="print the rows as JSON")

    p = commands.command(
        "export-texts", help="write the dev/test texts of tasks, one per line (for "
        "`lmlab data build --exclude`)",
        example="lmlab tasks export-texts --task wordnet-wic,fortunes-topic --out eval-texts.txt",
        handler=_export, group="tasks")
    p.add_argument("--task", required=True, action="append",
                   help="built-in task name(s), comma-separated or repeated; 'all' for every one")
    p.add_argument("--splits", default="dev,test", help="comma-separated splits (default dev,test)")
    p.add_argument("--size", default="full", choices=("cpu", "full"),
                   help="task size (default full: its dev/test contain the cpu ones)")
    _common.add_out(p, "output text file", overwrite="replace an existing --out file")

    p = commands.command(
        "baseline", help="run the TF-IDF + logistic/ridge regression baseline on a task",
        example="lmlab baseline --task fortunes-topic --out runs/baseline-fortunes",
        handler=_baseline)
    from lmlab.cli._task_options import add_task_arguments

    add_task_arguments(p)
    _common.add_flags(p, "seed")
    _common.add_out(p, "output folder (metrics.json, predictions)",
                    overwrite="write into an --out folder that already holds files")


def _list(args: argparse.Namespace) -> int:
    import json

    from lmlab.tasks.builtin import list_tasks

    rows = list_tasks()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    header = ("name", "type", "classes", "cpu train/dev/test", "full train/dev/test", "metrics")
    table = [header] + [
        (r["name"], r["type"], str(r["classes"]),
         f"{r['cpu_train']}/{r['cpu_dev']}/{r['cpu_test']}",
         f"{r['full_train']}/{r['full_dev']}/{r['full_test']}", r["metrics"])
        for r in rows
    ]
    _common.print_table(table)
    print("\nReaders for your own copies: GLUE TSV (--glue-dir), CoNLL-2003 columns, SQuAD JSON,"
          " CSV/TSV/JSONL tables; see docs/tasks.md.")
    return 0


def _task_names(values: list[str]) -> list[str]:
    from lmlab.tasks.builtin import BUILTIN_TASKS

    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    if "all" in names:
        return list(BUILTIN_TASKS)
    return names


def _export(args: argparse.Namespace) -> int:
    from lmlab.tasks.builtin import BUILTIN_TASKS, export_eval_texts
    from lmlab.utils.checks import check_names, check_output_file

    names = _task_names(args.task)
    check_names(names, list(BUILTIN_TASKS), "--task", "built-in task")
    splits = [s.strip() for s in args.splits.split(",") if s.strip()]
    check_names(splits or [args.splits], ["train", "dev", "test"], "--splits", "split")
    check_output_file(args.out, args.overwrite)
    count = export_eval_texts(names, args.out, splits=splits, size=args.size)
    print(f"wrote {count} texts of {', '.join(names)} ({', '.join(splits)}) to {args.out}")
    return 0


def _baseline(args: argparse.Namespace) -> int:
    from pathlib import Path

    from lmlab.cli._task_options import task_from_args
    from lmlab.tasks.baseline import write_tfidf_baseline
    from lmlab.utils.checks import check_output_folder

    check_output_folder(args.out, args.overwrite, "baseline")
    task = task_from_args(args, required=("train", "dev"))
    out = Path(args.out)
    result = write_tfidf_baseline(task, out, seed=args.seed)
    summary = ", ".join(f"{k} {v:.4f}" for k, v in result["dev"].items())
    print(f"{task.name}: {result['param']}={result['chosen']} (by {result['selected_by']}); "
          f"dev {summary}")
    if "test" in result:
        print("test " + ", ".join(f"{k} {v:.4f}" for k, v in result["test"].items()))
    print(f"wrote {out / 'metrics.json'} and predictions-*.jsonl")
    return 0
