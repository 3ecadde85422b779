"""SQuAD v1.1 / v2.0 JSON files as question-answering examples. An ``answer_start`` that is off is
moved to the nearest occurrence of the answer; an answer missing from its context is an error.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lmlab.tasks.readers import read_splits
from lmlab.tasks.types import Example, Task
from lmlab.utils.checks import check_file
from lmlab.utils.errors import LmlabError


def _locate(answer: dict[str, Any], context: str, qid: str, path: Path) -> dict[str, Any]:
    text = answer.get("text")
    if not isinstance(text, str):
        raise LmlabError(f"{path}: question {qid!r} has an answer without text",
                         "give every answer a 'text' and an 'answer_start'")
    start = answer.get("answer_start")
    if isinstance(start, int) and context[start:start + len(text)] == text:
        return {"text": text, "answer_start": start}
    positions = [i for i in range(len(context) - len(text) + 1) if context.startswith(text, i)]
    if not positions:
        raise LmlabError(f"{path}: the answer {text!r} of question {qid!r} does not occur in "
                         "its context", "fix the answer text or the context of that question")
    target = start if isinstance(start, int) else 0
    best = min(positions, key=lambda p: abs(p - target))
    return {"text": text, "answer_start": best}


def read_squad(path: str | os.PathLike) -> list[Example]:
    """Questions of a SQuAD JSON file as qa examples; unanswerable SQuAD 2.0 questions get
    ``answers=[]`` and ``extra["is_impossible"]=True``."""
    path = check_file(path, "SQuAD file", "check the path")
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except json.JSONDecodeError as error:
        raise LmlabError(f"{path} is not valid JSON ({error.msg}, line {error.lineno})",
                         "give the SQuAD JSON file (train-v1.1.json, dev-v2.0.json, ...)") from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise LmlabError(f"{path} has no top-level 'data' list",
                         "give a SQuAD-format file: {'data': [{'paragraphs': [...]}]}")
    examples = []
    for article in data["data"]:
        title = article.get("title", "")
        for paragraph in article.get("paragraphs", []):
            context = paragraph["context"]
            for qa in paragraph.get("qas", []):
                qid = str(qa.get("id", f"{path.stem}-{len(examples)}"))
                impossible = bool(qa.get("is_impossible", False))
                raw_answers = [] if impossible else qa.get("answers", [])
                answers = [_locate(a, context, qid, path) for a in raw_answers]
                if not answers and not impossible:
                    raise LmlabError(f"{path}: question {qid!r} has no answers and is not "
                                     "marked is_impossible",
                                     "add its answers, or set is_impossible: true (SQuAD 2.0)")
                extra: dict[str, Any] = {"title": title}
                if impossible:
                    extra["is_impossible"] = True
                examples.append(Example(id=qid, question=qa["question"], context=context,
                                        answers=answers, extra=extra))
    return examples


def load_squad_task(name: str, files: dict[str, str | os.PathLike]) -> Task:
    """A qa task from SQuAD files per split (``{"train": ..., "dev": ...}``)."""
    splits = read_splits(files, read_squad, "question")
    return Task(name=name, type="qa", labels=[], metrics=["exact_match", "squad_f1"],
                splits=splits, description=f"SQuAD from {', '.join(map(str, files.values()))}")
