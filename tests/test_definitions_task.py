"""WordNet definition modelling / reverse dictionary pairs (lmlab.tasks.definitions), on the
installed WordNet 3.0: the word is in its example, splits share no gloss, and the
references score as the metrics expect."""

from __future__ import annotations

import pytest

from lmlab.metrics.generation import bleu, sequence_accuracy
from lmlab.tasks.definitions import definition_pairs, definition_splits
from lmlab.utils.errors import LmlabError


@pytest.fixture(scope="module")
def define():
    return definition_splits("define")


def test_define_pairs_use_the_word_in_its_sentence(define):
    pairs = [p for split in define.values() for p in split]
    assert len(pairs) > 20_000  # WordNet 3.0 has about 33k quoted examples containing a lemma
    for pair in pairs[:2000]:
        word, sentence = pair.input_text.split(": ", 1)
        assert f" {word.lower()} " in f" {sentence.lower()} "
        assert len(pair.references) == 1 and pair.references[0]
    bank = [p for p in pairs if p.input_text.startswith("bank:") and "river" in p.input_text]
    assert bank and "slope" in bank[0].references[0]


def test_splits_share_no_gloss_and_are_stable(define):
    keys = {name: {p.key for p in split} for name, split in define.items()}
    assert not keys["train"] & keys["dev"] and not keys["train"] & keys["test"]
    assert not keys["dev"] & keys["test"]
    glosses = {name: {p.references[0] for p in split} for name, split in define.items()}
    assert not glosses["train"] & (glosses["dev"] | glosses["test"])  # no target seen in training
    total = sum(map(len, define.values()))
    assert 0.7 < len(define["train"]) / total < 0.9
    assert definition_splits("define")["dev"] == define["dev"]


def test_reverse_dictionary_accepts_any_lemma_of_the_synset():
    splits = definition_splits("reverse")
    pairs = splits["test"]
    assert len(pairs) > 5_000
    synonyms = next(p for p in pairs if len(p.references) > 1)
    predictions = [synonyms.references[-1]]
    assert sequence_accuracy(predictions, [list(synonyms.references)]) == 1.0
    glosses = {name: {p.input_text for p in split} for name, split in splits.items()}
    assert not glosses["train"] & glosses["test"]


def test_metrics_take_the_references_as_they_are(define):
    dev = define["dev"][:50]
    references = [p.references[0] for p in dev]
    assert bleu(references, references) == pytest.approx(1.0)


def test_bad_arguments_are_refused():
    with pytest.raises(LmlabError, match="unknown direction"):
        definition_pairs("backwards")
    with pytest.raises(LmlabError, match="sum to 1"):
        definition_splits("define", fractions=(0.9, 0.2, 0.1))
