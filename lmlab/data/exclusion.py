"""Keeping evaluation texts out of a pretraining corpus: a text leaks when its words equal a
document's words from one segment boundary to another; the matching segments are dropped,
found by hashing (docs/data.md, "Keeping evaluation texts out", says why and what it costs)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

KEY_WORDS = 3  # index key: the first (up to) 3 words of a text
_WORD = re.compile(r"\w+")
_CLAUSE_BREAK = re.compile(r"[;:](?=\s)")


def text_words(text: str) -> tuple[str, ...]:
    """The normalised words of a text: runs of letters/digits, lower-cased."""
    return tuple(_WORD.findall(text.lower()))


@dataclass
class Segment:
    """One segment of a document: ``sentence[start:end]`` holds its words
    ``words[first_word:end_word]`` of the document's word list."""

    sentence: int
    start: int
    end: int
    first_word: int
    end_word: int


def segment_words(sentences: Sequence[str]) -> tuple[list[str], list[Segment]]:
    """The normalised words of a document's sentences and its segments (sentences cut after
    each ``;`` or ``:`` that a space follows), in order."""
    words: list[str] = []
    segments: list[Segment] = []
    for number, sentence in enumerate(sentences):
        start = 0
        for end in [m.end() for m in _CLAUSE_BREAK.finditer(sentence)] + [len(sentence)]:
            found = _WORD.findall(sentence[start:end].lower())
            segments.append(Segment(number, start, end, len(words), len(words) + len(found)))
            words.extend(found)
            start = end
    return words, segments


@dataclass
class TextSet:
    """One set of texts to exclude (a built-in task's dev/test texts, or a file's lines)."""

    name: str
    kind: str  # "task" or "file"
    texts: int = 0
    sha256: str = ""
    details: dict = field(default_factory=dict)
    sentences_removed: int = 0  # whole sentences (a sentence may also lose some segments)
    words_removed: int = 0
    documents_removed: int = 0

    def summary(self) -> dict:
        return {"name": self.name, "kind": self.kind, **self.details, "texts": self.texts,
                "sha256": self.sha256, "sentences_removed": self.sentences_removed,
                "words_removed": self.words_removed,
                "documents_removed": self.documents_removed}


class SegmentExclusion:
    """An index of texts; :meth:`filter` drops the sentences of a document where one occurs
    as a whole segment (see the module docstring)."""

    def __init__(self) -> None:
        self.sets: list[TextSet] = []
        self.index: dict[tuple[str, ...], list[tuple[tuple[str, ...], int]]] = {}
        self.first_words: set[str] = set()
        self.key_lengths: set[int] = set()

    def add(self, text_set: TextSet, texts: Iterable[str]) -> None:
        """Index ``texts`` under ``text_set`` (its count and content hash are filled in)."""
        number = len(self.sets)
        self.sets.append(text_set)
        digest = hashlib.sha256()
        seen: set[tuple[str, ...]] = set()
        for text in texts:
            digest.update(text.encode("utf-8") + b"\n")
            words = text_words(text)
            if not words or words in seen:
                continue
            seen.add(words)
            key = words[:KEY_WORDS]
            self.index.setdefault(key, []).append((words, number))
            self.first_words.add(words[0])
            self.key_lengths.add(len(key))
        text_set.texts = len(seen)
        text_set.sha256 = digest.hexdigest()

    def __bool__(self) -> bool:
        return bool(self.index)

    def matches(self, words: list[str], segments: list[Segment]) -> list[tuple[int, int, int]]:
        """``(first word, end word, text set)`` of every whole-segment occurrence."""
        boundaries = {segment.first_word for segment in segments} | {len(words)}
        found = []
        index, first_words, lengths = self.index, self.first_words, sorted(self.key_lengths)
        for start in sorted(boundaries):
            if start == len(words) or words[start] not in first_words:
                continue
            for length in lengths:
                for candidate, number in index.get(tuple(words[start:start + length]), ()):
                    end = start + len(candidate)
                    if end in boundaries and tuple(words[start:end]) == candidate:
                        found.append((start, end, number))
        return found

    def filter(self, sentences: list[str]) -> list[str]:
        """The document without the segments where a text occurs (the same list when nothing
        leaks). A sentence that loses some segments keeps the others (``dog, domestic dog:
        <dev gloss>.`` becomes ``dog, domestic dog.``); one that loses all is dropped.
        Removals are counted on the first text set that matched."""
        words, segments = segment_words(sentences)
        matches = self.matches(words, segments)
        if not matches:
            return sentences
        owner: dict[int, int] = {}  # segment index -> text set that removes it
        for start, end, number in sorted(matches, key=lambda m: m[2]):
            for position, segment in enumerate(segments):
                if start <= segment.first_word < segment.end_word <= end:
                    owner.setdefault(position, number)
        kept: list[str] = []
        for number, sentence in enumerate(sentences):
            parts = [(i, seg) for i, seg in enumerate(segments) if seg.sentence == number]
            if not any(i in owner for i, _ in parts):
                kept.append(sentence)
                continue
            rest = "".join(sentence[seg.start:seg.end] for i, seg in parts if i not in owner)
            rest = _rejoin(rest, sentence)
            removed_words = len(sentence.split()) - len(rest.split())
            first_owner = min(owner[i] for i, _ in parts if i in owner)
            self.sets[first_owner].words_removed += removed_words
            if _WORD.search(rest):
                kept.append(rest)
            else:
                self.sets[first_owner].sentences_removed += 1
        if not kept:
            self.sets[min(owner.values())].documents_removed += 1
        return kept

    def summary(self) -> list[dict]:
        return [text_set.summary() for text_set in self.sets]


def _rejoin(rest: str, sentence: str) -> str:
    """What is left of a sentence, without a dangling ``;``/``:``, ending as it ended."""
    rest = " ".join(rest.split()).rstrip(";:,").rstrip()
    end = sentence.rstrip()[-1:]
    if rest and end in ".!?" and not rest.endswith((".", "!", "?")):
        rest += end
    return rest
