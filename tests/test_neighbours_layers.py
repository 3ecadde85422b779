"""``lmlab neighbours --layer all``: one forward pass indexes every layer, and each layer's
neighbours equal those of an index built for that layer alone."""

from __future__ import annotations

import pytest
from conftest import rounding_tolerance, run_lmlab

import lmlab
from lmlab.analysis.neighbours import ContextualIndex, find_occurrences, wordnet_sentences
from lmlab.utils.errors import LmlabError


@pytest.fixture(scope="module")
def minilm(minilm_dir):
    return lmlab.from_pretrained(minilm_dir), lmlab.Tokenizer.from_pretrained(minilm_dir)


def test_wordnet_sentences_are_a_sentence_source():
    found = find_occurrences(wordnet_sentences(), "broke", 1000)
    assert len(found) > 20 and all("broke" in s.lower() for s in found)


def test_every_layer_equals_its_own_single_layer_index(minilm):
    model, tok = minilm
    sentences = find_occurrences(wordnet_sentences(), "broke", 8)
    everything = ContextualIndex.build(model, tok, sentences, "broke", layer="all")
    assert everything.vectors.shape == (len(everything.sentences), 7, 384)
    by_layer = everything.query_by_layer("Dawn broke.", k=len(sentences))
    assert len(by_layer) == 7
    tolerance = rounding_tolerance(terms=384, depth=7)
    for layer, hits in enumerate(by_layer):
        single = ContextualIndex.build(model, tok, sentences, "broke", layer=layer)
        expected = single.query("Dawn broke.", k=len(sentences))
        assert {h.sentence: h.score for h in hits}.keys() == \
            {h.sentence: h.score for h in expected}.keys()
        scores = {h.sentence: h.score for h in expected}
        for hit in hits:
            assert abs(hit.score - scores[hit.sentence]) <= tolerance, (layer, hit.sentence)
        # the ranking is the same wherever scores are not tied to rounding
        for a, b in zip(hits, hits[1:]):
            if a.score - b.score > 2 * tolerance:
                assert scores[a.sentence] > scores[b.sentence], layer
    with pytest.raises(LmlabError, match="query_by_layer"):
        everything.query("Dawn broke.")
    with pytest.raises(LmlabError, match='layer="all"'):
        single.query_by_layer("Dawn broke.")


def test_command_prints_every_layer(minilm):
    model, tok = minilm
    result = run_lmlab("neighbours", "minilm", "--wordnet-examples", "--word", "broke",
                       "--layer", "all", "--k", "1", "--limit", "40", "Dawn broke.")
    assert result.returncode == 0, result.stderr
    assert "from WordNet example sentences" in result.stdout
    lines = result.stdout.splitlines()
    index = ContextualIndex.build(model, tok, wordnet_sentences(), "broke", layer="all", limit=40)
    for layer, hits in enumerate(index.query_by_layer("Dawn broke.", k=1)):
        header = f"  layer {layer}{' (embeddings)' if layer == 0 else ''}:"
        assert header in lines, header
        assert lines[lines.index(header) + 1].endswith(hits[0].sentence[:87])


def test_command_needs_a_sentence_source():
    result = run_lmlab("neighbours", "minilm", "--word", "broke", "Dawn broke.")
    assert result.returncode == 2 and "--corpus" in result.stderr
    result = run_lmlab("neighbours", "minilm", "--corpus", "nowhere/", "--wordnet-examples",
                       "--word", "broke", "Dawn broke.")
    assert result.returncode == 2 and "not allowed with" in result.stderr
