"""Read labelled examples from CSV, TSV and JSON-lines files through a column mapping (text,
optional second text, label; for multiple choice the context, choices and correct index). Every
problem names the file, the line and the fix.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from lmlab.tasks.types import Example, Task
from lmlab.utils.checks import check_choice, check_file
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import iter_jsonl

FORMATS = ("csv", "tsv", "jsonl")
_FORMAT_OF_SUFFIX = {"csv": "csv", "tsv": "tsv", "tab": "tsv", "txt": "tsv", "jsonl": "jsonl",
                     "json": "jsonl", "ndjson": "jsonl"}


def iter_rows(path: str | os.PathLike, format: str | None = None,
              fieldnames: Sequence[str] | None = None
              ) -> Iterator[tuple[int, dict[str, Any], list[str]]]:
    """``(line number, row dict, column names)`` for each record of a ``format`` table file
    (default: from the extension; ``.json`` counts as JSON lines); ``fieldnames`` for a file
    without a header (GLUE's CoLA). TSV is read with ``csv.QUOTE_NONE``: GLUE's files hold
    unbalanced quotes, meant literally."""
    path = check_file(path, "task file", "check the path")
    format = format or _FORMAT_OF_SUFFIX.get(path.suffix.lower().lstrip("."))
    if format is None:
        raise LmlabError(f"cannot tell the format of {path} from its extension",
                         "name it .csv, .tsv or .jsonl, or pass format='csv'|'tsv'|'jsonl'")
    check_choice(format, FORMATS, "format", "table format")
    if format == "jsonl":
        for number, row in iter_jsonl(path, encoding="utf-8-sig"):
            yield number, row, list(row)
        return
    delimiter = "," if format == "csv" else "\t"
    quoting = csv.QUOTE_MINIMAL if format == "csv" else csv.QUOTE_NONE
    csv.field_size_limit(1 << 30)
    with open(path, encoding="utf-8-sig", newline="") as handle:
        reader = csv.reader(handle, delimiter=delimiter, quoting=quoting)
        header = list(fieldnames) if fieldnames is not None else None
        for cells in reader:
            if not cells or (len(cells) == 1 and not cells[0].strip()):
                continue
            if header is None:
                header = [c.strip() for c in cells]
                continue
            yield reader.line_num, dict(zip(header, cells)), header


def _column(row: dict[str, Any], column: str, columns: list[str], path: Path, line: int) -> Any:
    if column not in row:
        if column not in columns:
            raise LmlabError(f"{path} has no column {column!r} (columns: {', '.join(columns)})",
                             "pass the right column name (e.g. --text-column/--label-column)")
        raise LmlabError(f"{path}, line {line}: the row is too short, it has no {column!r} value",
                         "check that every row has as many fields as the header")
    return row[column]


def read_table(path: str | os.PathLike, text_column: str, label_column: str | None = None,
               text_pair_column: str | None = None, format: str | None = None,
               fieldnames: Sequence[str] | None = None, id_column: str | None = None,
               regression: bool = False,
               skip_short_rows: bool = False) -> list[Example]:
    """Examples from one CSV/TSV/JSON-lines file through its columns (``label_column`` None
    for unlabelled files; ids from ``id_column`` or ``<file stem>-<line>``); ``regression``
    labels are floats. ``skip_short_rows`` skips rows lacking a field (QQP's few broken rows)."""
    path = Path(path)
    examples = []
    needed = [c for c in (text_column, text_pair_column, label_column) if c]
    for line, row, columns in iter_rows(path, format, fieldnames):
        if skip_short_rows and any(c in columns for c in needed) and not all(c in row for c in needed):
            continue
        text = _column(row, text_column, columns, path, line)
        pair = _column(row, text_pair_column, columns, path, line) if text_pair_column else None
        label: Any = None
        if label_column is not None:
            label = _column(row, label_column, columns, path, line)
            if regression:
                try:
                    label = float(label)
                except (TypeError, ValueError):
                    raise LmlabError(f"{path}, line {line}: label {label!r} is not a number",
                                     "a regression task needs numeric labels") from None
            elif label is not None:
                label = str(label).strip()
                if not label:  # it would train a class named ""
                    raise LmlabError(f"{path}, line {line}: the label (column "
                                     f"{label_column!r}) is empty",
                                     "give the row its label, or remove the row")
        example_id = str(row[id_column]) if id_column and id_column in row else f"{path.stem}-{line}"
        examples.append(Example(id=example_id, text=None if text is None else str(text),
                                text_pair=None if pair is None else str(pair), label=label,
                                extra={"line": line}))
    return examples


def _place(example: Example, where: str) -> str:
    """Where an example came from: its file and line, or its id."""
    line = example.extra.get("line")
    return f"{where}, line {line}" if line is not None else f"{where}, example {example.id}"


def check_labels(examples: Sequence[Example], labels: Sequence[str], where: str) -> None:
    """Raise for the first example whose label is not in ``labels`` (name label, line, set)."""
    valid = set(labels)
    for example in examples:
        if example.label is not None and example.label not in valid:
            raise LmlabError(f"{_place(example, where)}: label {example.label!r} is not in the "
                             "label set "
                             f"{sorted(valid)}",
                             "fix the label, or pass the full label list (--labels) if the set "
                             "is larger than what the training file shows")


def check_pair_texts(examples: Sequence[Example], where: str) -> None:
    """A pair task needs a second text in every example."""
    for example in examples:
        if not example.text_pair:
            raise LmlabError(f"{_place(example, where)}: a pair task got a single text (no "
                             "second text)",
                             "give the second text's column (--text-pair-column) or use a "
                             "single-text task type")


def not_utf8(path: Path) -> LmlabError:
    """The error for a task file that is not UTF-8 text, naming its first bad byte's offset in
    the file (a decoder's own offset counts from its chunk), and gzip if the file is that."""
    from lmlab.text.textfile import iter_file_text

    try:
        for _ in iter_file_text(path):
            pass
        problem = f"{path} is not UTF-8 text"
    except LmlabError as located:
        problem = located.problem
    with open(path, "rb") as handle:
        gzipped = handle.read(2) == b"\x1f\x8b"
    return LmlabError(problem + (" (the file is gzip-compressed)" if gzipped else ""),
                      f"decompress it first, e.g. `zcat {path} > plain{path.suffix}`" if gzipped else
                      "save it as UTF-8 text (e.g. `iconv -f LATIN1 -t UTF-8`)")


def read_splits(files: dict[str, str | os.PathLike],
                read: Callable[[str | os.PathLike], list[Example]],
                unit: str = "example") -> dict[str, list[Example]]:
    """``{split: read(path)}`` for each split file; a file without any ``unit`` (example,
    sentence, question) is an error naming the split and the file."""
    splits = {}
    for split, path in files.items():
        try:
            splits[split] = read(path)
        except UnicodeDecodeError:
            raise not_utf8(Path(path)) from None
        if not splits[split]:
            raise LmlabError(f"the {split} file {path} has no {unit}s",
                             f"give a {split} file with at least one {unit}")
    return splits


def load_table_task(name: str, files: dict[str, str | os.PathLike], text_column: str,
                    label_column: str, text_pair_column: str | None = None,
                    task_type: str | None = None, labels: Sequence[str] | None = None,
                    metrics: Sequence[str] | None = None, format: str | None = None,
                    positive_label: str | None = None) -> Task:
    """A :class:`Task` from table files, one per split; the label set is ``labels`` or the
    training file's, and the other splits' labels must belong to it."""
    if task_type is None:
        task_type = "pair-classification" if text_pair_column else "classification"
    regression = task_type == "regression"
    splits = read_splits(files, lambda path: read_table(
        path, text_column, label_column, text_pair_column, format, regression=regression))
    if task_type == "pair-classification":
        for split, examples in splits.items():
            check_pair_texts(examples, str(files[split]))
    if regression:
        labels = []
    elif labels is None:
        source = splits.get("train") or next(iter(splits.values()))
        labels = sorted({e.label for e in source if e.label is not None})
    labels = list(labels)
    if not regression:
        for split, examples in splits.items():
            check_labels(examples, labels, str(files[split]))
    if metrics is None:
        if regression:
            metrics = ["pearson", "spearman"]
        elif len(labels) == 2:
            metrics = ["accuracy", "f1", "macro_f1"]
        else:
            metrics = ["accuracy", "macro_f1"]
    if positive_label is None and len(labels) == 2:
        positive_label = "1" if "1" in labels else labels[1]
    return Task(name=name, type=task_type, labels=labels, metrics=list(metrics), splits=splits,
                positive_label=positive_label, description=f"from {', '.join(map(str, files.values()))}")


def _choices_of(row: dict[str, Any], choice_columns: Sequence[str], columns: list[str],
                path: Path, line: int) -> list[str]:
    """The candidate answers of one row: one column per choice (SWAG's ``ending0..3``), or one
    column holding a list (a JSON list, or a JSON-encoded list string in CSV/TSV)."""
    if len(choice_columns) > 1:
        return [str(_column(row, c, columns, path, line)) for c in choice_columns]
    value = _column(row, choice_columns[0], columns, path, line)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            value = None
    if not isinstance(value, list) or not value:
        raise LmlabError(f"{path}, line {line}: column {choice_columns[0]!r} is not a list of "
                         "choices", "give a JSON list of the candidate answers, or name one "
                         "column per choice (--choices-column ending0,ending1,...)")
    return [str(v) for v in value]


def read_choices_table(path: str | os.PathLike, text_column: str, choices_columns: Sequence[str],
                       label_column: str | None = None,
                       format: str | None = None) -> list[Example]:
    """Multiple-choice examples: the context in ``text_column``, the choices in one column
    holding a list or one column each, the 0-based index of the right one in ``label_column``."""
    path = Path(path)
    examples = []
    for line, row, columns in iter_rows(path, format):
        text = _column(row, text_column, columns, path, line)
        choices = _choices_of(row, choices_columns, columns, path, line)
        label = None
        if label_column is not None:
            raw = _column(row, label_column, columns, path, line)
            try:
                index = int(str(raw).strip())
            except ValueError:
                index = -1
            if not 0 <= index < len(choices):
                raise LmlabError(f"{path}, line {line}: label {raw!r} is not the index of one "
                                 f"of its {len(choices)} choices",
                                 f"give the 0-based index (0..{len(choices) - 1}) of the correct "
                                 "choice")
            label = str(index)
        examples.append(Example(id=f"{path.stem}-{line}", text=str(text), choices=choices,
                                label=label, extra={"line": line}))
    return examples


def load_choice_task(name: str, files: dict[str, str | os.PathLike], text_column: str,
                     choices_columns: Sequence[str], label_column: str = "label",
                     format: str | None = None) -> Task:
    """A multiple-choice :class:`Task` from table files, one per split, scored by accuracy;
    every example has the same number of choices (a batch is one (B, C, T) tensor)."""
    if not choices_columns:
        raise LmlabError("no column of choices was named",
                         "name the column with the list of choices, or one column per choice")
    splits = read_splits(files, lambda path: read_choices_table(
        path, text_column, choices_columns, label_column, format))
    counts = {len(e.choices or []) for examples in splits.values() for e in examples}
    if len(counts) > 1:
        raise LmlabError(f"the examples have different numbers of choices ({sorted(counts)})",
                         "give every example the same number of choices")
    count = counts.pop()
    return Task(name=name, type="multiple-choice", labels=[str(i) for i in range(count)],
                metrics=["accuracy"], splits=splits,
                description=f"multiple choice from {', '.join(map(str, files.values()))}")
