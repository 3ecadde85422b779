"""What every corpus source provides, and the cached counts `lmlab data list` shows.
A source knows its name, whether its files are installed (and how to install them if not),
which files it reads (they key the count cache) and how to turn them into documents."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from lmlab.text.corpus import Document
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import atomic_write_json, read_json, stable_hash
from lmlab.utils.paths import cache_dir

# Bump when a reader's output changes, so cached counts are recomputed.
READER_VERSION = 1


@dataclass
class SourceCounts:
    """How much text a source yields (before deduplication and exclusion)."""

    documents: int = 0
    sentences: int = 0
    words: int = 0

    def add(self, document: Document) -> None:
        self.documents += 1
        self.sentences += len(document.sentences)
        self.words += sum(len(s.split()) for s in document.sentences)


class Source:
    """A corpus source. Subclasses set ``name``, ``description``, ``install_hint`` and implement
    :meth:`files` and :meth:`iter_documents`."""

    name: str = ""
    description: str = ""
    install_hint: str = ""

    def files(self) -> list[Path]:
        """The files this source reads (their sizes and mtimes key the count cache)."""
        raise NotImplementedError

    def is_available(self) -> bool:
        """True when every file the source needs is present."""
        try:
            files = self.files()
        except LmlabError:
            return False
        return bool(files) and all(path.exists() for path in files)

    def require(self) -> None:
        """Raise a clear error when the source is not installed, or when every file it reads
        is empty (the corpus would be empty: refused before anything is written)."""
        if not self.is_available():
            raise LmlabError(f"corpus source {self.name!r} is not installed",
                             self.install_hint or "check the path you gave")
        files = self.files()
        if files and not any(path.stat().st_size for path in files):
            raise LmlabError(f"corpus source {self.name!r} holds no text: its {len(files)} "
                             "file(s) are empty", "put text in them, or leave the source out")

    def iter_documents(self) -> Iterator[Document]:
        """Yield the source's documents, sentences split and normalised, in a fixed order."""
        raise NotImplementedError

    def fingerprint(self) -> dict:
        """What the cached counts depend on: the files' sizes and mtimes and the reader version."""
        stats = []
        for path in self.files():
            stat = path.stat()
            stats.append([str(path), stat.st_size, stat.st_mtime_ns])
        return {"source": self.name, "reader": READER_VERSION, "files": stats}

    def cached_counts(self) -> SourceCounts | None:
        """Counts from the cache if the files have not changed since they were computed."""
        entry = _load_count_cache().get(self.name)
        if entry and entry.get("key") == stable_hash(self.fingerprint()):
            return SourceCounts(**entry["counts"])
        return None

    def store_counts(self, counts: SourceCounts) -> None:
        """Remember counts for these files (called by :meth:`counts` and by full builds)."""
        cache = _load_count_cache()
        cache[self.name] = {"key": stable_hash(self.fingerprint()), "counts": asdict(counts)}
        atomic_write_json(_count_cache_path(), cache)

    def counts(self) -> SourceCounts:
        """Documents, sentences and words: read once, then cached until the files change."""
        cached = self.cached_counts()
        if cached is not None:
            return cached
        counts = SourceCounts()
        for document in self.iter_documents():
            counts.add(document)
        self.store_counts(counts)
        return counts


def _count_cache_path() -> Path:
    return cache_dir() / "corpus-source-counts.json"


def _load_count_cache() -> dict:
    try:
        data = read_json(_count_cache_path())
    except (OSError, json.JSONDecodeError):
        return {}  # a missing or damaged cache is recomputed, never fatal
    return data if isinstance(data, dict) else {}
