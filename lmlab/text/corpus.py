"""The on-disk corpus format every lmlab stage reads: ``manifest.json``, ``train.jsonl`` and
``validation.jsonl``, a document per line with its sentences (docs/data.md has the layout).
Files are read line by line: a corpus larger than memory streams.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from lmlab.utils.checks import check_choice
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import iter_jsonl, read_json

SPLITS = ("train", "validation")
REBUILD = "rebuild the corpus with `lmlab data build`"


@dataclass
class Document:
    """A document: an id unique within the corpus, its source name, and its sentences
    (kept apart because segment pairs and sentence packing need the boundaries)."""

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
    def from_record(cls, record: dict, where: str) -> Document:
        """The document a corpus line's object holds; ``where`` (``file:line``) names a line
        that is not a corpus record."""
        try:
            return cls(id=record["id"], source=record["source"],
                       sentences=list(record["sentences"]))
        except (KeyError, TypeError) as error:
            raise LmlabError(f"{where} is not a corpus record ({error!r})", REBUILD) from None


def split_path(corpus_dir: str | Path, split: str) -> Path:
    """Path of one split's JSON-lines file, with a clear error when it is missing."""
    check_choice(split, SPLITS, "split", "corpus split")
    corpus_dir = Path(corpus_dir)
    path = corpus_dir / f"{split}.jsonl"
    if not path.exists():
        raise LmlabError(f"{corpus_dir} is not an lmlab corpus (no {path.name})",
                         "build one with `lmlab data build --out DIR`")
    return path


def read_corpus(corpus_dir: str | Path, split: str = "train") -> Iterator[Document]:
    """Stream the documents of one split, in file order."""
    path = split_path(corpus_dir, split)
    for number, record in iter_jsonl(path):
        yield Document.from_record(record, f"{path}:{number}")


def read_manifest(corpus_dir: str | Path) -> dict:
    """The corpus manifest (sources, counts, hash)."""
    path = Path(corpus_dir) / "manifest.json"
    if not path.exists():
        raise LmlabError(f"{corpus_dir} has no manifest.json",
                         "build the corpus with `lmlab data build --out DIR`")
    return read_json(path)
