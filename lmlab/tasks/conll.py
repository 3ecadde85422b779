"""CoNLL-2003 style column files (one token per line, the tag in the last column by default, a
blank line between sentences, ``-DOCSTART-`` skipped) as tagging examples; IOB1 -> IOB2.
"""

from __future__ import annotations

import os

from lmlab.tasks.readers import read_splits
from lmlab.tasks.types import Example, Task
from lmlab.utils.checks import check_file
from lmlab.utils.errors import LmlabError


def read_conll(path: str | os.PathLike, tag_column: int = -1,
               same_columns: bool = False) -> list[Example]:
    """Sentences of a CoNLL column file as tagging examples (``tokens`` + ``tags``);
    ``same_columns``: every line must have the first line's columns (the probing files)."""
    path = check_file(path, "CoNLL file", "check the path")
    examples: list[Example] = []
    tokens: list[str] = []
    tags: list[str] = []
    start_line = 1
    columns = None

    def flush() -> None:
        if tokens:
            examples.append(Example(id=f"{path.stem}-{len(examples)}", tokens=list(tokens),
                                    tags=list(tags), extra={"line": start_line}))
        tokens.clear()
        tags.clear()

    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            line = line.rstrip("\n")
            stripped = line.strip()
            if not stripped or stripped.startswith("-DOCSTART-"):  # a sentence ends
                flush()
                continue
            fields = stripped.split()
            if len(fields) < 2:
                raise LmlabError(f"{path}, line {number}: {line!r} has no label for its word "
                                 "(one column)",
                                 "write 'token POS chunk NER' (or 'token TAG') per line")
            columns = columns or len(fields)
            if same_columns and len(fields) != columns:
                raise LmlabError(f"{path}, line {number}: {len(fields)} columns where the file's "
                                 f"first line has {columns}",
                                 "give every word line the same columns (word ... label)")
            if tag_column == 0 or not -len(fields) < tag_column < len(fields):
                raise LmlabError(f"{path}, line {number}: tag column {tag_column} is not among "
                                 f"the {len(fields) - 1} tag columns of {stripped!r}",
                                 "pass a column from 1 (the first after the token) to "
                                 f"{len(fields) - 1}, or -1 for the last")
            if not tokens:
                start_line = number
            tokens.append(fields[0])
            tags.append(fields[tag_column])
    flush()
    return examples


def iob1_to_iob2(tags: list[str]) -> list[str]:
    """IOB1 -> IOB2: an ``I-X`` that starts an entity (after O or another type) becomes ``B-X``."""
    converted = []
    previous = "O"
    for tag in tags:
        if tag.startswith("I-") and (previous == "O" or previous[2:] != tag[2:]):
            tag = "B-" + tag[2:]
        converted.append(tag)
        previous = tag
    return converted


def load_conll_task(name: str, files: dict[str, str | os.PathLike],
                    to_iob2: bool = False, tag_column: int = -1) -> Task:
    """A tagging task from CoNLL files per split, its tag set from all splits; ``tag_column``
    picks the tag (-1, the last: NER in CoNLL-2003; 1 its POS tag, 2 its chunk tag)."""
    splits = read_splits(files, lambda path: read_conll(path, tag_column), "sentence")
    if to_iob2:
        for examples in splits.values():
            for example in examples:
                example.tags = iob1_to_iob2(example.tags or [])
    tag_set = sorted({t for examples in splits.values() for e in examples for t in e.tags or []},
                     key=lambda t: (t != "O", t[2:], t))
    return Task(name=name, type="tagging", labels=tag_set,
                metrics=["entity_f1", "entity_precision", "entity_recall"], splits=splits,
                description=f"CoNLL tagging from {', '.join(map(str, files.values()))}")
