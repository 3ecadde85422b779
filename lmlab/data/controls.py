"""Count-conditioned text (Ficler & Goldberg 2017, "Controlling linguistic style aspects in
neural language generation"): properties counted in a text (words, sentences, commas), bucketed
into control tokens that prefix each training example, and the same counting to check samples
(docs/generation-control.md)."""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmlab.text.corpus import SPLITS, Document, read_corpus
from lmlab.text.sentences import split_sentences
from lmlab.utils.checks import check_at_least, check_names
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import atomic_write_json, atomic_write_text

START = "<|start|>"  # opens every example, conditioned or not: the prompt of an unconditioned LM
_WORD = re.compile(r"\w")
_CONTROL = re.compile(r"<([a-z]+)=([^<>]+)>")


def count_words(text: str) -> int:
    """Whitespace-separated tokens holding a letter or digit (a lone dash is no word)."""
    return sum(1 for token in text.split() if _WORD.search(token))


def count_sentences(text: str) -> int:
    """Sentences by the corpus's own splitter (lmlab.text.sentences)."""
    return len(split_sentences(text))


def count_commas(text: str) -> int:
    return text.count(",")


@dataclass(frozen=True)
class Property:
    """A counted property and its buckets: (label, lowest, highest or None) count ranges."""

    name: str
    count: Any  # str -> int
    buckets: tuple[tuple[str, int, int | None], ...]

    @property
    def labels(self) -> list[str]:
        return [label for label, _, _ in self.buckets]

    def bucket(self, count: int) -> str | None:
        """The label of the bucket holding ``count`` (None: no bucket does)."""
        return next((label for label, low, high in self.buckets
                     if count >= low and (high is None or count <= high)), None)

    def token(self, label: str) -> str:
        return f"<{self.name}={label}>"


# the paper's length buckets (<=10, 11-20, 21-40, >40 words); sentences and commas as counts
PROPERTIES = {
    "words": Property("words", count_words, (("0-10", 0, 10), ("11-20", 11, 20),
                                             ("21-40", 21, 40), ("41+", 41, None))),
    "sentences": Property("sentences", count_sentences,
                          (("1", 1, 1), ("2", 2, 2), ("3+", 3, None))),
    "commas": Property("commas", count_commas,
                       (("0", 0, 0), ("1", 1, 1), ("2", 2, 2), ("3+", 3, None))),
}


def check_properties(names: Sequence[str]) -> list[str]:
    """``names`` checked against :data:`PROPERTIES` (at least one, no repeats)."""
    names = list(names)
    if not names or len(set(names)) != len(names):
        raise LmlabError(f"properties {names} are empty or repeat a name",
                         f"give distinct names from {', '.join(PROPERTIES)}")
    check_names(names, list(PROPERTIES), "properties", "counted property")
    return names


def properties_of(text: str, names: Sequence[str]) -> dict[str, str | None]:
    """Each property's bucket label for ``text``."""
    return {name: PROPERTIES[name].bucket(PROPERTIES[name].count(text)) for name in names}


def counts_of(text: str, names: Sequence[str]) -> dict[str, int]:
    """Each property's raw count in ``text``."""
    return {name: PROPERTIES[name].count(text) for name in names}


def control_tokens(names: Sequence[str]) -> list[str]:
    """:data:`START` and every bucket's token of ``names``: the tokenizer's special tokens."""
    return [START, *(PROPERTIES[n].token(label) for n in names for label in PROPERTIES[n].labels)]


def control_prefix(request: dict[str, str]) -> str:
    """The prefix asking for ``request`` (property -> bucket label): :data:`START` and one
    control token per property, in the given order; ``{}`` is an unconditioned prompt."""
    for name, label in request.items():
        check_names([name], list(PROPERTIES), "properties", "counted property")
        if label not in PROPERTIES[name].labels:
            raise LmlabError(f"{name} has no bucket {label!r}",
                             f"use one of {', '.join(PROPERTIES[name].labels)}")
    return START + "".join(PROPERTIES[n].token(label) for n, label in request.items())


def parse_prefix(text: str) -> tuple[dict[str, str], str]:
    """(request, rest) of a text that starts with a control prefix; the inverse of
    :func:`control_prefix` followed by the text."""
    if not text.startswith(START):
        raise LmlabError(f"text does not start with {START}: {text[:40]!r}",
                         "pass a text written by control_prefix(...) + text")
    rest, request = text[len(START):], {}
    while (match := _CONTROL.match(rest)) and match.group(1) in PROPERTIES:
        request[match.group(1)] = match.group(2)
        rest = rest[match.end():]
    return request, rest


def meets(text: str, request: dict[str, str]) -> dict[str, bool]:
    """Per requested property, whether ``text``'s count falls in the requested bucket."""
    got = properties_of(text, list(request))
    return {name: got[name] == label for name, label in request.items()}


def passages(sentences: Sequence[str], key: str, max_sentences: int) -> Iterator[str]:
    """Runs of 1..``max_sentences`` consecutive sentences (lengths drawn from ``key``'s seed),
    joined by a space: the examples of one document."""
    rng = random.Random(int(hashlib.sha256(key.encode()).hexdigest()[:12], 16))
    at = 0
    while at < len(sentences):
        size = rng.randint(1, max_sentences)
        yield " ".join(sentences[at:at + size])
        at += size


@dataclass
class ConditionedCorpus:
    """What :func:`write_conditioned_corpus` wrote: examples per split and, per property, the
    training examples of each bucket (the base rates) and of each joint request."""

    examples: dict[str, int]
    buckets: dict[str, dict[str, int]]
    joint: dict[str, int]

    def base_rate(self, request: dict[str, str]) -> float:
        """Share of training examples whose counts meet ``request`` (one or all properties)."""
        total = self.examples["train"]
        if len(request) == 1:
            (name, label), = request.items()
            return self.buckets[name].get(label, 0) / total
        return self.joint.get(joint_key(request), 0) / total


def joint_key(request: dict[str, str]) -> str:
    return " ".join(f"{name}={label}" for name, label in request.items())


def write_conditioned_corpus(corpus_dir: str | Path, outs: dict[str, str | Path],
                             names: Sequence[str], max_sentences: int = 3,
                             max_words: int = 100, max_examples: int | None = None
                             ) -> ConditionedCorpus:
    """From an lmlab corpus, one example per document (passages of up to ``max_sentences``
    sentences, at most ``max_words`` words) written as corpus folders: ``outs["conditioned"]``
    with each example's control prefix, ``outs["unconditioned"]`` with :data:`START` alone
    (the same texts). ``max_examples`` caps the training split (validation: a 50th of it)."""
    names = check_properties(names)
    check_at_least(max_sentences, 1, "max_sentences")
    check_at_least(max_words, 1, "max_words")
    unknown = set(outs) - {"conditioned", "unconditioned"}
    if unknown:
        raise LmlabError(f"unknown corpus kinds {sorted(unknown)}",
                         "use 'conditioned' and/or 'unconditioned'")
    buckets = {name: Counter() for name in names}
    joint: Counter = Counter()
    examples = {}
    for split in SPLITS:
        cap = None if max_examples is None else (
            max_examples if split == "train" else max(1, max_examples // 50))
        rows = list(_examples(read_corpus(corpus_dir, split), names, max_sentences, max_words,
                              cap))
        examples[split] = len(rows)
        for kind, out in outs.items():
            lines = (Document(f"{i}", source, [(control_prefix(request) if kind == "conditioned"
                                                else START) + text]).to_json()
                     for i, (source, text, request) in enumerate(rows))
            Path(out).mkdir(parents=True, exist_ok=True)
            atomic_write_text(Path(out) / f"{split}.jsonl", "".join(f"{ln}\n" for ln in lines))
        if split == "train":
            for _, _, request in rows:
                joint[joint_key(request)] += 1
                for name in names:
                    buckets[name][request[name]] += 1
    result = ConditionedCorpus(examples, {n: dict(c) for n, c in buckets.items()}, dict(joint))
    for kind, out in outs.items():
        atomic_write_json(Path(out) / "manifest.json", {
            "format": "lmlab-corpus", "kind": f"count-{kind}", "source": str(corpus_dir),
            "properties": names, "max_sentences": max_sentences, "max_words": max_words,
            "examples": examples, "hash": hashlib.sha256(json.dumps(
                [kind, str(corpus_dir), names, max_sentences, max_words, max_examples,
                 examples]).encode()).hexdigest()})
    return result


def _examples(documents: Iterable[Document], names: list[str], max_sentences: int,
              max_words: int, cap: int | None) -> Iterator[tuple[str, str, dict[str, str]]]:
    """(source, text, request) of each kept passage; a passage some bucket cannot hold (no
    sentence found) or over ``max_words`` is skipped."""
    kept = 0
    for document in documents:
        for text in passages(document.sentences, document.id, max_sentences):
            if cap is not None and kept >= cap:
                return
            if count_words(text) > max_words:
                continue
            request = properties_of(text, names)
            if None in request.values():
                continue
            kept += 1
            yield document.source, text, request  # type: ignore[misc]
