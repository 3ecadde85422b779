"""WordNet definition modelling (``define``: a word in an example sentence -> the gloss of that
sense) and its inverse, the reverse dictionary (``reverse``: a gloss -> any lemma of the synset),
split by gloss so no gloss is in two splits (docs/tasks.md says why not by word or synset).
"""

from __future__ import annotations

from lmlab.tasks.builtin import hash_splits
from lmlab.tasks.types import TextPair
from lmlab.text.sources.wordnet import read_synsets
from lmlab.utils.checks import check_choice

DIRECTIONS = ("define", "reverse")


def definition_pairs(direction: str = "define") -> list[TextPair]:
    """Every pair of ``direction`` from WordNet, in file order, keyed by its gloss. ``define``
    takes each synset's examples that contain one of its lemmas literally (the word the gloss
    defines must be in the sentence); ``reverse`` takes every synset with a gloss."""
    check_choice(direction, DIRECTIONS, "direction", "direction")
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
    return hash_splits(definition_pairs(direction), lambda pair: pair.key, fractions)
