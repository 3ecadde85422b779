"""The on-disk corpus format every lmlab stage reads.

A corpus is a folder::

    DIR/manifest.json       sources, document/sentence/word counts, content hash
    DIR/train.jsonl         one document per line
    DIR/validation.jsonl

Each line is ``{"id": "kjv/Genesis/1", "source": "kjv", "sentences": ["In the beginning ...", ...]}``.
Documents keep their sentence boundaries because next-sentence / sentence-order prediction and
segment packing need both boundaries. Files are read line by line: a corpus larger than memory
streams.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from lmlab.utils.errors import LmlabError

SPLITS = ("train", "validation")


@dataclass
class Document:
    """A document: an id unique within the corpus, its source name, and its sentences."""

    id: str
    source: str
    sentences: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The document as one string (sentences joined by a space)."""
        return " ".join(self.sentences)

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "source": self.source, "sentences": self.sentences},
                          ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> Document:
        record = json.loads(line)
        return cls(id=record["id"], source=record["source"], sentences=list(record["sentences"]))


def split_path(corpus_dir: str | Path, split: str) -> Path:
    """Path of one split's JSON-lines file, with a clear error when it is missing."""
    if split not in SPLITS:
        raise LmlabError(f"unknown corpus split {split!r}", f"use one of {', '.join(SPLITS)}")
    corpus_dir = Path(corpus_dir)
    path = corpus_dir / f"{split}.jsonl"
    if not path.exists():
        raise LmlabError(f"{corpus_dir} is not an lmlab corpus (no {path.name})",
                         "build one with `lmlab data build --out DIR`")
    return path


def read_corpus(corpus_dir: str | Path, split: str = "train") -> Iterator[Document]:
    """Stream the documents of one split, in file order."""
    path = split_path(corpus_dir, split)
    with open(path, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                yield Document.from_json(line)
            except (json.JSONDecodeError, KeyError) as error:
                raise LmlabError(f"{path}:{line_number} is not a corpus record ({error})",
                                 "rebuild the corpus with `lmlab data build`") from None


def read_manifest(corpus_dir: str | Path) -> dict:
    """The corpus manifest (sources, counts, hash)."""
    path = Path(corpus_dir) / "manifest.json"
    if not path.exists():
        raise LmlabError(f"{corpus_dir} has no manifest.json",
                         "build the corpus with `lmlab data build --out DIR`")
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)
