"""The task options shared by ``lmlab finetune``, ``lmlab evaluate`` and ``lmlab baseline``:
one set of flags, parsed into :func:`lmlab.tasks.load_task`'s keyword arguments."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from lmlab.tasks.types import TASK_TYPES


def add_task_arguments(p: argparse.ArgumentParser) -> None:
    """Add ``--task`` and the options naming its data (built-in, GLUE folder or own files)."""
    p.add_argument("--task", required=True,
                   help="a built-in task (wordnet-supersense, wordnet-wic, fortunes-topic), a "
                        "GLUE task with --glue-dir (rte, sst2, stsb, ...), or a name for the "
                        "task given by --train/--dev/--test")
    # --size as in `lmlab tasks export-texts`; --split is its old name
    p.add_argument("--size", "--split", dest="size", default="cpu", choices=("cpu", "full"),
                   help="size of a built-in task (default cpu)")
    p.add_argument("--glue-dir", help="GLUE data folder (glue_data/ with CoLA/, SST-2/, RTE/, ...)")
    p.add_argument("--train", help="training file: a .csv/.tsv/.jsonl table, a CoNLL column "
                                   "file (--type tagging) or a SQuAD .json (--type qa)")
    p.add_argument("--dev", help="dev file (same format as --train)")
    p.add_argument("--test", help="test file (optional)")
    p.add_argument("--type", choices=TASK_TYPES,
                   help="task type of the files; picks the reader (default: multiple-choice "
                        "with --choices-column, pair-classification with --text-pair-column, "
                        "else classification)")
    p.add_argument("--text-column", default="text",
                   help="table column of the text (multiple choice: the context; default text)")
    p.add_argument("--text-pair-column", help="table column of the second text of a pair")
    p.add_argument("--label-column", default="label",
                   help="table column of the label (multiple choice: the 0-based index of the "
                        "correct choice; default label)")
    p.add_argument("--choices-column",
                   help="multiple choice: a column holding the list of choices, or "
                        "comma-separated columns, one per choice (ending0,ending1,...)")
    p.add_argument("--tag-column", type=int,
                   help="tagging: CoNLL column of the tag (default -1, the last; 1 = POS)")
    p.add_argument("--iob1", action="store_true",
                   help="tagging: the tags are IOB1 (original CoNLL-2003 files); convert to IOB2")


def task_from_args(args: argparse.Namespace, required: Sequence[str] = ()):
    """The :class:`lmlab.tasks.Task` the options name (``required``: splits that need files)."""
    from lmlab.tasks.loader import load_task

    return load_task(args.task, size=args.size, glue_dir=args.glue_dir, train=args.train,
                     dev=args.dev, test=args.test, task_type=args.type,
                     text_column=args.text_column, text_pair_column=args.text_pair_column,
                     label_column=args.label_column, choices_column=args.choices_column,
                     tag_column=args.tag_column, iob1=args.iob1, required=required)
