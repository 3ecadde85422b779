"""``lmlab tasks list``, ``lmlab tasks export-texts`` and ``lmlab baseline``."""

from __future__ import annotations

import argparse


def register(commands) -> None:
    p = commands.command("list", help="list the built-in downstream tasks and their split sizes",
                         example="lmlab tasks list", handler=_list, group="tasks")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")

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
    p.add_argument("--out", required=True, help="output text file")

    p = commands.command(
        "baseline", help="run the TF-IDF + logistic/ridge regression baseline on a task",
        example="lmlab baseline --task fortunes-topic --out runs/baseline-fortunes",
        handler=_baseline)
    p.add_argument("--task", required=True,
                   help="a built-in task, a GLUE task (with --glue-dir), or a name for the task "
                        "given by --train/--dev/--test")
    p.add_argument("--size", default="cpu", choices=("cpu", "full"),
                   help="size of a built-in task (default cpu)")
    p.add_argument("--glue-dir", help="folder of the GLUE data (glue_data/ with CoLA/, SST-2/, ...)")
    p.add_argument("--train", help="training file (.csv, .tsv or .jsonl)")
    p.add_argument("--dev", help="dev file, used to choose C")
    p.add_argument("--test", help="test file (optional)")
    p.add_argument("--text-column", default="text", help="column of the text (default text)")
    p.add_argument("--text-pair-column", help="column of the second text of a pair task")
    p.add_argument("--label-column", default="label", help="column of the label (default label)")
    p.add_argument("--type", choices=("classification", "pair-classification", "regression"),
                   help="task type (default: pair-classification with --text-pair-column, "
                        "else classification)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="output folder (metrics.json, predictions)")


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
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
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
    from lmlab.tasks.builtin import export_eval_texts

    names = _task_names(args.task)
    splits = [s.strip() for s in args.splits.split(",") if s.strip()]
    count = export_eval_texts(names, args.out, splits=splits, size=args.size)
    print(f"wrote {count} texts of {', '.join(names)} ({', '.join(splits)}) to {args.out}")
    return 0


def _load_task(args: argparse.Namespace):
    from lmlab.tasks.builtin import BUILTIN_TASKS, load_builtin_task
    from lmlab.utils.errors import LmlabError

    if args.train or args.dev:
        if not (args.train and args.dev):
            raise LmlabError("a task from files needs both --train and --dev",
                             "give --train FILE --dev FILE (and optionally --test FILE)")
        from lmlab.tasks.readers import load_table_task

        files = {"train": args.train, "dev": args.dev}
        if args.test:
            files["test"] = args.test
        return load_table_task(args.task, files, text_column=args.text_column,
                               label_column=args.label_column,
                               text_pair_column=args.text_pair_column, task_type=args.type)
    if args.glue_dir:
        from lmlab.tasks.glue import load_glue_task

        return load_glue_task(args.task, args.glue_dir)
    if args.task in BUILTIN_TASKS:
        return load_builtin_task(args.task, args.size)
    raise LmlabError(f"unknown task {args.task!r}",
                     f"use a built-in task ({', '.join(BUILTIN_TASKS)}), a GLUE task with "
                     "--glue-dir, or give --train/--dev files")


def _baseline(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from lmlab.tasks.baseline import run_tfidf_baseline
    from lmlab.utils.io import atomic_write_json, atomic_write_text

    task = _load_task(args)
    result = run_tfidf_baseline(task, seed=args.seed, return_predictions=True)
    predictions = result.pop("predictions")
    out = Path(args.out)
    atomic_write_json(out / "metrics.json", result)
    for split, values in predictions.items():
        lines = [json.dumps({"id": e.id, "prediction": p, "label": e.label}, ensure_ascii=False)
                 for e, p in zip(task.splits[split], values)]
        atomic_write_text(out / f"predictions-{split}.jsonl", "\n".join(lines) + "\n")
    summary = ", ".join(f"{k} {v:.4f}" for k, v in result["dev"].items())
    print(f"{task.name}: {result['param']}={result['chosen']} (by {result['selected_by']}); "
          f"dev {summary}")
    if "test" in result:
        print("test " + ", ".join(f"{k} {v:.4f}" for k, v in result["test"].items()))
    print(f"wrote {out / 'metrics.json'} and predictions-*.jsonl")
    return 0
