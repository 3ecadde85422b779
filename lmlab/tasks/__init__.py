"""Downstream tasks: one in-memory shape (:class:`Task` of :class:`Example`), readers for the
real formats, built-in tasks made from offline Debian data, the TF-IDF baseline, and
:func:`load_task`, the one loader every command uses (docs/tasks.md).
"""

from __future__ import annotations

from lmlab.tasks.baseline import run_tfidf_baseline
from lmlab.tasks.builtin import (
    BUILTIN_TASKS,
    export_eval_texts,
    list_tasks,
    load_builtin_task,
)
from lmlab.tasks.conll import load_conll_task, read_conll
from lmlab.tasks.glue import GLUE_FORMATS, load_glue_task
from lmlab.tasks.loader import load_task
from lmlab.tasks.readers import load_choice_task, load_table_task, read_choices_table, read_table
from lmlab.tasks.squad import load_squad_task, read_squad
from lmlab.tasks.types import TASK_TYPES, Example, Task

__all__ = [
    "BUILTIN_TASKS", "GLUE_FORMATS", "TASK_TYPES", "Example", "Task", "export_eval_texts",
    "list_tasks", "load_builtin_task", "load_choice_task", "load_conll_task", "load_glue_task",
    "load_squad_task", "load_table_task", "load_task", "read_choices_table", "read_conll",
    "read_squad", "read_table", "run_tfidf_baseline",
]
