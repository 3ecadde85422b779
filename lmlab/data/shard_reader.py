"""A split's tokens as the pretraining stream reads them (:class:`TokenSource`): in token
shards written by :func:`lmlab.data.shards.build_shards` (:class:`ShardReader`, through
``np.memmap``: nothing is loaded whole, a read touches only the pages it needs, and processes
share the page cache) or in memory (``lmlab.data.pretraining.InMemoryTokenSource``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from lmlab.data.shards import FORMAT, MANIFEST
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import read_json


class TokenSource:
    """Token ids and word-start flags of one split, stored as consecutive shards (subclasses
    give :meth:`_shard`), with the offsets of its documents (D + 1,) and sentences (S + 1,)
    into them (the last entry is the end); a document starts at a sentence start."""

    vocab_size: int | None = None
    _sources: tuple[np.ndarray, list[str]] | None = None

    def __init__(self, shard_lengths: list[int], document_offsets: np.ndarray,
                 sentence_offsets: np.ndarray):
        self._shard_starts = np.concatenate([[0], np.cumsum(shard_lengths)]).astype(np.int64)
        self._documents = document_offsets
        self._sentences = sentence_offsets
        self.num_tokens = int(self._shard_starts[-1])
        self.num_documents = len(document_offsets) - 1
        self.num_sentences = len(sentence_offsets) - 1

    def _shard(self, index: int, words: bool) -> Any:
        """Token ids (or, with ``words``, word-start flags) of shard ``index``."""
        raise NotImplementedError

    def __len__(self) -> int:
        """Number of documents."""
        return self.num_documents

    def document_offsets(self) -> np.ndarray:
        return self._documents

    def sentence_offsets(self) -> np.ndarray:
        return self._sentences

    def document_sources(self) -> tuple[np.ndarray, list[str]] | None:
        """Each document's source as a code (D,) and the codes' names (``kjv``, ``wordnet``):
        what ``--mix`` samples by; None when the split does not record them."""
        return self._sources

    def _read(self, start: int, stop: int, words: bool) -> np.ndarray:
        if not 0 <= start <= stop <= self.num_tokens:
            raise LmlabError(f"token range [{start}, {stop}) is outside the split "
                             f"({self.num_tokens} tokens)", "ask for a range inside the split")
        parts = []
        index = max(int(np.searchsorted(self._shard_starts, start, "right")) - 1, 0)
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

    def window(self, start: int, length: int) -> np.ndarray:
        """``length`` consecutive token ids from global offset ``start`` (int64 array)."""
        return self._read(start, start + length, words=False)

    def word_starts(self, start: int, length: int) -> np.ndarray:
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

    def document(self, index: int) -> np.ndarray:
        """Token ids of document ``index``."""
        start, stop = self.document_span(index)
        return self._read(start, stop, words=False)

    def document_word_starts(self, index: int) -> np.ndarray:
        """Word-start mask of document ``index``."""
        start, stop = self.document_span(index)
        return self._read(start, stop, words=True)

    def sentence(self, index: int) -> np.ndarray:
        """Token ids of sentence ``index`` (sentences are numbered across the split)."""
        index = self._check(index, self.num_sentences, "sentence")
        return self._read(int(self._sentences[index]), int(self._sentences[index + 1]), False)

    def document_sentences(self, index: int, word_starts: bool = False) -> list[Any]:
        """Token ids of each sentence of document ``index``; with ``word_starts``, pairs of
        (token ids, word-start mask)."""
        start, stop = self.document_span(index)
        ids, words = self._read(start, stop, False), self._read(start, stop, True)
        first, last = np.searchsorted(self._sentences, [start, stop], "left")
        cuts = (self._sentences[first:last + 1] - start).tolist()
        pieces = [(ids[a:b], words[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]
        return pieces if word_starts else [piece for piece, _ in pieces]


class ShardReader(TokenSource):
    """Documents, sentences, windows and word-start masks of ``split`` of the shard folder
    ``directory``; given a ``tokenizer`` (or its fingerprint string), shards written with
    another one are refused."""

    def __init__(self, directory: str | os.PathLike, split: str = "train",
                 tokenizer: Any = None):
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
        counts = [int(s["num_tokens"]) for s in info["shards"]]
        self._memmaps: dict[tuple[int, bool], Any] = {}
        super().__init__(counts,
                         np.load(self.directory / info["documents"]["file"], mmap_mode="r"),
                         np.load(self.directory / info["sentences"]["file"], mmap_mode="r"))
        self.special_ids = dict(self.manifest["tokenizer"].get("special_ids", {}))
        size = self.manifest["tokenizer"].get("size")
        self.vocab_size = int(size) if size is not None else None
        if info.get("sources"):
            self._sources = (np.load(self.directory / info["sources"]["file"], mmap_mode="r"),
                             list(info["sources"]["names"]))

    def __repr__(self) -> str:
        return (f"ShardReader({self.directory}, {self.split}: {self.num_documents} documents, "
                f"{self.num_sentences} sentences, {self.num_tokens} tokens)")

    def _shard(self, index: int, words: bool) -> Any:
        if (index, words) not in self._memmaps:
            entry = self.info["shards"][index]["files"]["words" if words else "tokens"]
            self._memmaps[index, words] = np.memmap(self.directory / entry["file"], mode="r",
                                                    dtype=np.uint8 if words else self.dtype)
        return self._memmaps[index, words]
