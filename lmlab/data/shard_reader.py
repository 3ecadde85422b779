"""Random access to token shards written by :func:`lmlab.data.shards.build_shards`, through
``np.memmap``: nothing is loaded whole, a read touches only the pages it needs, and processes
(data-loader workers) share the page cache."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lmlab.data.shards import FORMAT, MANIFEST
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import read_json


class ShardReader:
    """Documents, sentences, windows and word-start masks of ``split`` of the shard folder
    ``directory``; given a ``tokenizer`` (or its fingerprint string), shards written with
    another one are refused."""

    def __init__(self, directory: str | os.PathLike, split: str = "train",
                 tokenizer: Any = None):
        import numpy as np

        self.directory = Path(directory)
        path = self.directory / MANIFEST
        if not path.exists():
            raise LmlabError(f"{self.directory} has no {MANIFEST} (not a token-shard folder, "
                             "or its build never finished a shard)",
                             "build shards with `lmlab data tokenize --tokenizer T --corpus DIR "
                             f"--out {self.directory}`")
        self.manifest = read_json(path)
        if self.manifest.get("format") != FORMAT:
            raise LmlabError(f"{path} is not a token-shard manifest",
                             "point at a folder written by `lmlab data tokenize`")
        info = self.manifest.get("splits", {}).get(split)
        if info is None:
            raise LmlabError(f"{self.directory} has no {split!r} split "
                             f"(has: {', '.join(self.manifest.get('splits', {})) or 'none'})",
                             "pick a split that was tokenized")
        if not info.get("complete"):
            raise LmlabError(f"the {split} shards in {self.directory} are incomplete (the build "
                             "was interrupted)", "re-run `lmlab data tokenize` with the same "
                             "arguments; it resumes")
        if tokenizer is not None:
            expected = tokenizer if isinstance(tokenizer, str) else tokenizer.fingerprint()
            found = self.manifest["tokenizer"]["fingerprint"]
            if expected != found:
                raise LmlabError(
                    f"the shards in {self.directory} were written by another tokenizer "
                    f"(fingerprint {found[:12]}, given {expected[:12]}; written with "
                    f"{self.manifest['tokenizer'].get('name_or_path') or 'a trained tokenizer'})",
                    "use the tokenizer the shards were built with, or re-tokenize the corpus "
                    "with this one")
        self.split = split
        self.info = info
        self.dtype = np.dtype(self.manifest["dtype"])
        self.num_tokens = int(info["num_tokens"])
        self.num_documents = int(info["num_documents"])
        self.num_sentences = int(info["num_sentences"])
        counts = [int(s["num_tokens"]) for s in info["shards"]]
        self._shard_starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._tokens: list[Any] = [None] * len(counts)
        self._words: list[Any] = [None] * len(counts)
        self._documents = np.load(self.directory / info["documents"]["file"], mmap_mode="r")
        self._sentences = np.load(self.directory / info["sentences"]["file"], mmap_mode="r")
        self.special_ids = dict(self.manifest["tokenizer"].get("special_ids", {}))

    def __len__(self) -> int:
        """Number of documents."""
        return self.num_documents

    def __repr__(self) -> str:
        return (f"ShardReader({self.directory}, {self.split}: {self.num_documents} documents, "
                f"{self.num_sentences} sentences, {self.num_tokens} tokens)")

    def _shard(self, index: int, words: bool) -> Any:
        import numpy as np

        cache = self._words if words else self._tokens
        if cache[index] is None:
            entry = self.info["shards"][index]["files"]["words" if words else "tokens"]
            dtype = np.uint8 if words else self.dtype
            cache[index] = np.memmap(self.directory / entry["file"], dtype=dtype, mode="r")
        return cache[index]

    def _read(self, start: int, stop: int, words: bool) -> Any:
        import numpy as np

        if not 0 <= start <= stop <= self.num_tokens:
            raise LmlabError(f"token range [{start}, {stop}) is outside the {self.split} split "
                             f"({self.num_tokens} tokens)", "ask for a range inside the split")
        parts = []
        first = int(np.searchsorted(self._shard_starts, start, "right")) - 1
        index = max(first, 0)
        position = start
        while position < stop:
            base = int(self._shard_starts[index])
            end = min(stop, int(self._shard_starts[index + 1]))
            parts.append(self._shard(index, words)[position - base:end - base])
            position = end
            index += 1
        dtype = np.uint8 if words else np.int64
        if not parts:
            return np.zeros(0, dtype=dtype)
        return np.concatenate(parts).astype(dtype)

    def window(self, start: int, length: int) -> Any:
        """``length`` consecutive token ids from global offset ``start`` (int64 array)."""
        return self._read(start, start + length, words=False)

    def word_starts(self, start: int, length: int) -> Any:
        """The word-start mask (uint8, 1 = the token begins a word) of a window."""
        return self._read(start, start + length, words=True)

    def _check(self, index: int, count: int, what: str) -> int:
        if not -count <= index < count:
            raise LmlabError(f"{what} {index} is out of range ({count} {what}s)",
                             f"use an index in [0, {count})")
        return index % count

    def document_span(self, index: int) -> tuple[int, int]:
        """(start, stop) token offsets of document ``index``."""
        index = self._check(index, self.num_documents, "document")
        return int(self._documents[index]), int(self._documents[index + 1])

    def sentence_span(self, index: int) -> tuple[int, int]:
        """(start, stop) token offsets of sentence ``index``."""
        index = self._check(index, self.num_sentences, "sentence")
        return int(self._sentences[index]), int(self._sentences[index + 1])

    def document(self, index: int) -> Any:
        """Token ids of document ``index``."""
        start, stop = self.document_span(index)
        return self._read(start, stop, words=False)

    def document_word_starts(self, index: int) -> Any:
        """Word-start mask of document ``index``."""
        start, stop = self.document_span(index)
        return self._read(start, stop, words=True)

    def sentence(self, index: int) -> Any:
        """Token ids of sentence ``index`` (sentences are numbered across the split)."""
        start, stop = self.sentence_span(index)
        return self._read(start, stop, words=False)

    def document_sentence_range(self, index: int) -> range:
        """Indices of the sentences of document ``index``."""
        import numpy as np

        start, stop = self.document_span(index)
        first = int(np.searchsorted(self._sentences[:-1], start, "left"))
        last = int(np.searchsorted(self._sentences[:-1], stop, "left"))
        return range(first, last)

    def document_sentences(self, index: int) -> list[Any]:
        """Token ids of each sentence of document ``index``."""
        return [self.sentence(i) for i in self.document_sentence_range(index)]
