"""Sentences for static word vectors, streamed, and their vocabulary.

word2vec and GloVe read a corpus as sentences of words: an lmlab corpus folder (``lmlab data
build``: documents already split into sentences) or plain text files (one sentence per line).
Words are the lower-cased runs of letters and digits (GloVe 6B is lower-cased too, and the
evaluations match case-insensitively). A :class:`Sentences` stream reads its source again from
the start on each pass, holding one sentence at a time, so a corpus larger than memory trains.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lmlab.utils.errors import LmlabError

_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*")


def words_of(text: str) -> list[str]:
    """The lower-cased words of ``text``: runs of letters and digits, an inner apostrophe kept
    (``"Don't stop, 2 cats!"`` -> ``["don't", "stop", "2", "cats"]``)."""
    return _WORD.findall(text.lower())


class Sentences:
    """A re-iterable stream of sentences (word lists): every ``iter()`` reads the source again
    from the start, so training holds no more than one sentence of it at a time.

    ``corpus_sentences`` and ``text_sentences`` build one; any callable returning an iterable
    of word lists (a generator function) can be wrapped: ``Sentences(lambda: my_generator())``.
    """

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




@contextlib.contextmanager
def threads_for_training(threads: int) -> Iterator[None]:
    """Run torch on ``threads`` intra-op threads inside the block, then restore the setting.
    word2vec's and GloVe's steps are small (a few hundred rows): a second thread buys nothing,
    and on a busy host its barriers cost dearly (measured: ``index_add_`` 100x slower with 2
    threads than with 1 on a loaded 2-core machine), so training defaults to one thread."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def check_training_counts(config: Any, names: tuple[str, ...]) -> None:
    """Refuse, before any work, settings that word2vec and GloVe share: the whole numbers
    ``names`` of ``config`` must be at least 1, ``max_vocab`` (if set) at least 2, ``threads``
    at least 1."""
    for name in names:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise LmlabError(f"{name} must be a whole number of at least 1, not {value!r}",
                             f"give a positive {name}")
    max_vocab = config.max_vocab
    if max_vocab is not None and max_vocab < 2:
        raise LmlabError(f"max_vocab must be at least 2, not {max_vocab}",
                         "give a larger max_vocab, or none")
    if config.threads < 1:
        raise LmlabError(f"threads must be at least 1, not {config.threads}",
                         "give a positive number of threads")
