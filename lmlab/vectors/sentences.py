"""Sentences of words for static word vectors, streamed from an lmlab corpus folder or text
files (one sentence per line), and their vocabulary. Words are lower-cased (as GloVe 6B's);
each pass reads the source again, so a corpus larger than memory trains.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lmlab.utils.errors import LmlabError

_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*")


def words_of(text: str) -> list[str]:
    """The lower-cased words of ``text``: runs of letters and digits, an inner apostrophe kept
    (``"Don't stop, 2 cats!"`` -> ``["don't", "stop", "2", "cats"]``)."""
    return _WORD.findall(text.lower())


class Sentences:
    """A re-iterable stream of sentences (word lists): every ``iter()`` calls ``open_stream``
    (e.g. a generator function) to read the source again from the start."""

    def __init__(self, open_stream: Callable[[], Iterable[list[str]]], description: str = ""):
        self.open_stream = open_stream
        self.description = description

    def __iter__(self) -> Iterator[list[str]]:
        return iter(self.open_stream())

    def __repr__(self) -> str:
        return f"Sentences({self.description})"


def corpus_sentences(corpus_dir: str | Path, split: str = "train") -> Sentences:
    """The sentences of an lmlab corpus folder (``lmlab data build``) as word lists."""
    from lmlab.text.corpus import read_corpus, split_path

    split_path(corpus_dir, split)  # a folder that is not a corpus is refused now

    def stream() -> Iterator[list[str]]:
        for document in read_corpus(corpus_dir, split):
            for sentence in document.sentences:
                words = words_of(sentence)
                if words:
                    yield words

    return Sentences(stream, f"corpus {corpus_dir} ({split})")


def text_sentences(paths: Iterable[str | Path]) -> Sentences:
    """The lines of plain UTF-8 text files as word lists (one line, one sentence)."""
    paths = [Path(p) for p in paths]
    for path in paths:
        if not path.is_file():
            raise LmlabError(f"no text file at {path}",
                             "give text files (one sentence per line) or an lmlab corpus folder")

    def stream() -> Iterator[list[str]]:
        for path in paths:
            with open(path, encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    words = words_of(line)
                    if words:
                        yield words

    return Sentences(stream, ", ".join(str(p) for p in paths))


def sentences_from(sources: str | Path | Iterable[str | Path], split: str = "train"
                   ) -> Sentences:
    """An lmlab corpus folder (it holds ``train.jsonl``), or one or more text files."""
    if isinstance(sources, str | Path):
        sources = [sources]
    sources = [Path(s) for s in sources]
    if len(sources) == 1 and sources[0].is_dir():
        return corpus_sentences(sources[0], split)
    folders = [s for s in sources if s.is_dir()]
    if folders:
        raise LmlabError(f"{folders[0]} is a folder among several sources",
                         "give one lmlab corpus folder, or text files")
    return text_sentences(sources)


# -- vocabulary --------------------------------------------------------------------------------------
@dataclass
class Vocabulary:
    """Words by descending count (ties in first-seen order) and their counts; ``fingerprint``:
    a hash of the sentences they were counted from, where asked for (a resumed run compares
    it, so it continues only on the same text)."""

    words: list[str]
    counts: np.ndarray  # (V,) int64
    fingerprint: str | None = None

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def index(self) -> dict[str, int]:
        return {w: i for i, w in enumerate(self.words)}


def count_words(sentences: Iterable[list[str]], min_count: int, max_vocab: int | None = None,
                fingerprint: bool = False) -> Vocabulary:
    """One streaming pass: the words seen at least ``min_count`` times, most frequent first,
    at most ``max_vocab`` of them (and with ``fingerprint``, a sha256 of every sentence in
    order). Refuses a corpus that leaves fewer than two words."""
    counter: Counter[str] = Counter()
    digest = hashlib.sha256() if fingerprint else None
    sentences_seen = 0
    for sentence in sentences:
        counter.update(sentence)
        sentences_seen += 1
        if digest is not None:
            digest.update("\x1f".join(sentence).encode() + b"\n")
    kept = [(w, c) for w, c in counter.items() if c >= min_count]
    kept.sort(key=lambda item: -item[1])  # stable: ties keep their first-seen order
    if max_vocab is not None:
        kept = kept[:max_vocab]
    if len(kept) < 2:
        raise LmlabError(f"only {len(kept)} word(s) occur at least {min_count} times "
                         f"({sentences_seen} sentences, {len(counter)} distinct words, "
                         f"{sum(counter.values())} in all)",
                         "give more text, or a lower --min-count")
    return Vocabulary([w for w, _ in kept], np.array([c for _, c in kept], dtype=np.int64),
                      digest.hexdigest() if digest is not None else None)



def word_chunks(sentences: Iterable[list[str]], index: dict[str, int], chunk_words: int,
                skip: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """The in-vocabulary words of ``sentences`` as rows of ``index`` in runs of about
    ``chunk_words`` words read: (word rows, the sentence number of each, sentences read so
    far), after the first ``skip`` sentences (read and passed over: a resumed epoch's done
    part). A run with no vocabulary word is not yielded."""
    get, missing = index.get, itertools.repeat(-1)
    rows: list[int] = []
    lengths: list[int] = []
    first = number = skip - 1
    for number, sentence in enumerate(itertools.islice(sentences, skip, None), start=skip):
        rows.extend(map(get, sentence, missing))  # -1: not in the vocabulary
        lengths.append(len(sentence))
        if len(rows) >= chunk_words:
            yield from _known(rows, lengths, first + 1, number + 1)
            rows, lengths, first = [], [], number
    yield from _known(rows, lengths, first + 1, number + 1)


def _known(rows: list[int], lengths: list[int], first: int, read: int
           ) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    ids = np.array(rows, np.int64)
    numbers = np.repeat(np.arange(first, first + len(lengths)), lengths)
    known = ids >= 0
    if known.any():
        yield ids[known], numbers[known], read
