"""One task loader for every command (``finetune``, ``evaluate``, ``baseline``): a built-in
task, a GLUE task folder, or your own files, read by the reader of the task type (:data:`READERS`;
docs/tasks.md has the table). Every option is checked before any file is read.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from lmlab.tasks.types import SPLITS, TASK_TYPES, Task
from lmlab.utils.checks import check_choice, check_file, check_folder
from lmlab.utils.errors import LmlabError

READERS = {"classification": "table", "pair-classification": "table", "regression": "table",
           "multiple-choice": "table", "tagging": "conll", "qa": "squad"}


def _check_options(task_type: str, text_pair_column: str | None, choices_column: str | None,
                   tag_column: int | None, iob1: bool) -> None:
    """Options that belong to another task type are errors, not silently ignored."""
    def wrong(option: str, types: str) -> LmlabError:
        return LmlabError(f"{option} does not apply to a {task_type} task",
                          f"drop {option}, or pass --type {types}")

    if text_pair_column and task_type not in ("pair-classification", "regression"):
        raise wrong("--text-pair-column", "pair-classification or regression")
    if choices_column and task_type != "multiple-choice":
        raise wrong("--choices-column", "multiple-choice")
    if task_type == "multiple-choice" and not choices_column:
        raise LmlabError("a multiple-choice task needs the column(s) of its choices",
                         "pass --choices-column COLUMN (a list per row) or "
                         "--choices-column ending0,ending1,... (one column per choice)")
    if (tag_column is not None or iob1) and task_type != "tagging":
        raise wrong("--tag-column/--iob1", "tagging")


def load_task(name: str, *, size: str = "cpu", glue_dir: str | os.PathLike | None = None,
              train: str | os.PathLike | None = None, dev: str | os.PathLike | None = None,
              test: str | os.PathLike | None = None, task_type: str | None = None,
              text_column: str = "text", text_pair_column: str | None = None,
              label_column: str = "label", choices_column: str | None = None,
              tag_column: int | None = None, iob1: bool = False,
              required: Sequence[str] = ()) -> Task:
    """The task named by a command's options: a built-in task (at ``size``), a GLUE task in
    ``glue_dir``, or your own ``train``/``dev``/``test`` files read by the reader of
    ``task_type`` (default: inferred from the columns) through the column options, which mean
    what the CLI's flags of the same names mean (docs/tasks.md). ``required``: the splits the
    caller needs files for (``("train", "dev")`` to fine-tune)."""
    if task_type is not None:
        check_choice(task_type, TASK_TYPES, "--type", "task type")
    files = {split: path for split, path in zip(SPLITS, (train, dev, test)) if path}
    if glue_dir is not None:
        if files:
            raise LmlabError("--glue-dir and --train/--dev/--test files were both given",
                             "give the GLUE folder with a GLUE task name, or your own files")
        return _load_glue(name, glue_dir, task_type, required)
    if files:
        return _load_files(name, files, task_type, text_column, text_pair_column, label_column,
                           choices_column, tag_column, iob1, required)
    return _load_builtin(name, size)


def _load_files(name: str, files: dict[str, str | os.PathLike], task_type: str | None,
                text_column: str, text_pair_column: str | None, label_column: str,
                choices_column: str | None, tag_column: int | None, iob1: bool,
                required: Sequence[str]) -> Task:
    from lmlab.tasks.conll import load_conll_task
    from lmlab.tasks.readers import load_choice_task, load_table_task
    from lmlab.tasks.squad import load_squad_task

    missing = [split for split in required if split not in files]
    if missing:
        raise LmlabError(f"a task from files needs a {' and a '.join(missing)} file",
                         " ".join(f"--{s} FILE" for s in missing) + " (and optionally --test "
                         "FILE)")
    for split, path in files.items():
        check_file(path, f"the --{split} file", "check the path")
    if task_type is None:  # from the columns: a choices column, a second text, or one text
        task_type = "multiple-choice" if choices_column else (
            "pair-classification" if text_pair_column else "classification")
    _check_options(task_type, text_pair_column, choices_column, tag_column, iob1)
    if task_type not in READERS:
        raise LmlabError(f"lmlab reads no {task_type} task from files",
                         "use a built-in image task (fashion-mnist, digits)")
    reader = READERS[task_type]
    if reader == "conll":
        return load_conll_task(name, files, to_iob2=iob1,
                               tag_column=-1 if tag_column is None else tag_column)
    if reader == "squad":
        return load_squad_task(name, files)
    if task_type == "multiple-choice":
        columns = [c.strip() for c in (choices_column or "").split(",") if c.strip()]
        return load_choice_task(name, files, text_column, columns, label_column)
    return load_table_task(name, files, text_column, label_column, text_pair_column, task_type)


def _load_glue(name: str, glue_dir: str | os.PathLike, task_type: str | None,
               required: Sequence[str]) -> Task:
    from lmlab.tasks.glue import GLUE_FORMATS, glue_key, load_glue_task

    spec = GLUE_FORMATS[glue_key(name)]
    if task_type is not None and task_type != spec.task_type:
        raise LmlabError(f"GLUE task {spec.key} is a {spec.task_type} task, not {task_type}",
                         "drop --type (GLUE tasks know their type)")
    check_folder(glue_dir, "the GLUE folder",
                 "point --glue-dir at the folder the GLUE download script wrote")
    task = load_glue_task(name, glue_dir)
    for split in required:
        task.split(split)
    return task


def _load_builtin(name: str, size: str) -> Task:
    from lmlab.tasks.builtin import BUILTIN_TASKS, load_builtin_task
    from lmlab.tasks.glue import GLUE_FORMATS, glue_key
    from lmlab.tasks.images import IMAGE_TASKS, load_image_task

    if name in BUILTIN_TASKS:
        return load_builtin_task(name, size=size)
    if name in IMAGE_TASKS:
        return load_image_task(name, size=size)
    try:
        glue_key(name)
    except LmlabError:
        pass
    else:
        raise LmlabError(f"{name!r} is a GLUE task, whose data is not built in",
                         f"give the GLUE data folder: --glue-dir glue_data (tasks: "
                         f"{', '.join(GLUE_FORMATS)})")
    raise LmlabError(f"unknown task {name!r}", f"use a built-in task "
                     f"({', '.join([*BUILTIN_TASKS, *IMAGE_TASKS])}), a GLUE task with "
                     "--glue-dir, or give --train/--dev files (see docs/tasks.md)")
