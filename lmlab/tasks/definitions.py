"""WordNet definition modelling and its inverse, the reverse dictionary: text-to-text tasks
built from WordNet 3.0's glosses (the text task of the inverse-problems family).

- ``define``: a word and an example sentence that uses it -> the gloss of that sense
  (*bank: "he sat on the bank of the river"* -> *sloping land (especially the slope beside a
  body of water)*). Scored with BLEU and chrF against the gloss.
- ``reverse``: a gloss -> the word (any lemma of the synset is correct: a list of references).
  Scored with sequence accuracy.

Splits are made by gloss: every pair whose gloss hashes to a split goes there, so a gloss is
in one split only and the model cannot memorise a gloss it is then tested on (splitting by word
would not do: two lemmas of a synset share its gloss; nor by synset: 59 glosses, such as
"extremely", belong to several synsets). A word with several senses can be seen
in training with one gloss and tested with another, as a dictionary user meets it.
Deterministic; no randomness beyond the hash.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from lmlab.tasks.types import TextPair
from lmlab.tasks.wordnet import read_synsets
from lmlab.utils.errors import LmlabError

DIRECTIONS = ("define", "reverse")


def _bucket(key: str, fractions: Sequence[float]) -> str:
    position = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2 ** 64
    if position < fractions[0]:
        return "train"
    return "dev" if position < fractions[0] + fractions[1] else "test"


def definition_pairs(direction: str = "define") -> list[TextPair]:
    """Every pair of ``direction`` from WordNet, in file order, keyed by its gloss. ``define``
    takes each synset's examples that contain one of its lemmas literally (the word the gloss
    defines must be in the sentence); ``reverse`` takes every synset with a gloss."""
    if direction not in DIRECTIONS:
        raise LmlabError(f"unknown direction {direction!r}", f"use one of {', '.join(DIRECTIONS)}")
    pairs = []
    for synset in read_synsets():
        if not synset.definition:
            continue
        if direction == "reverse":
            pairs.append(TextPair(synset.definition, tuple(synset.lemmas), synset.definition))
            continue
        for example in synset.examples:
            padded = f" {example.lower()} "
            lemma = next((w for w in synset.lemmas if f" {w.lower()} " in padded), None)
            if lemma is not None:
                pairs.append(TextPair(f"{lemma}: {example}", (synset.definition,),
                                      synset.definition))
    return pairs


def definition_splits(direction: str = "define",
                      fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
                      ) -> dict[str, list[TextPair]]:
    """The pairs of ``direction`` by split; pairs sharing a key share a split."""
    if abs(sum(fractions) - 1.0) > 1e-9 or min(fractions) < 0:
        raise LmlabError(f"split fractions {fractions} must be non-negative and sum to 1",
                         "use e.g. (0.8, 0.1, 0.1)")
    splits: dict[str, list[TextPair]] = {"train": [], "dev": [], "test": []}
    for pair in definition_pairs(direction):
        splits[_bucket(pair.key, fractions)].append(pair)
    return splits
