"""BART's noising transforms (lmlab.objectives.bart_noise): each transform's invariants and
statistics on real text (the first KJV chapters, MiniLM's WordPiece)."""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import pytest
from conftest import minilm_raw_tokenizer

from lmlab.objectives.bart_noise import (
    BartNoise,
    apply_noise,
    delete_tokens,
    infill_spans,
    mask_tokens,
    permute_sentences,
    poisson_span_lengths,
    rotate_document,
)
from lmlab.utils.errors import LmlabError


@functools.lru_cache(maxsize=1)
def _documents() -> tuple[list[list[np.ndarray]], int, np.ndarray]:
    """KJV chapters as lists of sentence id arrays; the [MASK] id; word starts per vocab id."""
    from lmlab.text.sources.kjv import KJVSource

    tokenizer = minilm_raw_tokenizer()
    docs = [[np.asarray(tokenizer.encode(s, add_special_tokens=False).ids, dtype=np.int64)
             for s in d.sentences] for d in itertools.islice(KJVSource().iter_documents(), 30)]
    vocab = tokenizer.get_vocab()
    starts = np.ones(max(vocab.values()) + 1, dtype=bool)
    for piece, index in vocab.items():
        starts[index] = not piece.startswith("##")
    return docs, vocab["[MASK]"], starts


def _is_subsequence(short: np.ndarray, long: np.ndarray) -> bool:
    it = iter(long.tolist())
    return all(any(x == y for y in it) for x in short.tolist())


def test_token_masking_keeps_length_and_masks_the_ratio():
    docs, mask, _ = _documents()
    ids = np.concatenate(docs[0])
    out = mask_tokens(ids, mask, 0.3, np.random.default_rng(0))
    assert len(out) == len(ids)
    changed = out != ids
    assert (out[changed] == mask).all()
    assert changed.sum() == math.ceil(0.3 * len(ids))  # the text has no [MASK] of its own


def test_token_deletion_leaves_a_subsequence():
    docs, _, _ = _documents()
    ids = np.concatenate(docs[1])
    out = delete_tokens(ids, 0.2, np.random.default_rng(1))
    assert len(out) == len(ids) - math.ceil(0.2 * len(ids))
    assert _is_subsequence(out, ids)


def test_poisson_lengths_cover_the_budget_with_mean_lambda():
    rng = np.random.default_rng(2)
    lengths = poisson_span_lengths(100_000, 3.0, rng)
    assert lengths.sum() == 100_000
    assert lengths[:-1].mean() == pytest.approx(3.0, abs=0.05)  # tol: 33,000 spans, sd 0.01; the last is cut
    assert (lengths == 0).mean() == pytest.approx(np.exp(-3.0), abs=0.01)  # tol: sd 0.001; P(0) = e^-3


def test_text_infilling_statistics_on_real_text():
    """Over many documents: 30% of the words are covered, the spans' mean length is the
    Poisson mean (of its non-zero part), one mask per span plus one per zero-length span,
    whole words only, and deleting the masks leaves a subsequence of the original."""
    docs, mask, starts = _documents()
    covered = words = masks = 0
    spans, inserted = [], 0
    rng = np.random.default_rng(3)
    for doc in docs:
        ids = np.concatenate(doc)
        word_starts = starts[ids]
        result = infill_spans(ids, mask, 0.3, rng, poisson_lambda=3.0, word_starts=word_starts)
        assert _is_subsequence(result.ids[result.ids != mask], ids)
        # whole words: a mask is never followed by a ## piece, and what a mask replaced
        # began at a word start (the kept token before it ends a word: the next original
        # token after it is a word start)
        after_mask = np.flatnonzero(result.ids[:-1] == mask) + 1
        assert starts[result.ids[after_mask]].all()
        covered += result.span_words.sum()
        words += word_starts.sum()
        masks += (result.ids == mask).sum()
        spans += result.span_words.tolist()
        inserted += result.inserted
    assert covered / words == pytest.approx(0.3, abs=0.01)  # tol: sampling
    assert masks == len(spans) + inserted
    lam = 3.0  # the mean of Poisson(3) given it is not zero: lam / (1 - e^-lam)
    assert np.mean(spans) == pytest.approx(lam / (1 - np.exp(-lam)), rel=0.1)  # tol: sampling
    assert inserted > 0  # zero-length spans exist and insert masks


def test_infilling_removes_whole_words_only():
    """With unique ids (KJV's word boundaries, ids 1000...), every removed stretch begins at a
    word start and ends at the end of a word."""
    docs, mask, starts = _documents()
    real = np.concatenate([np.concatenate(d) for d in docs[:5]])
    word_starts = starts[real]
    ids = np.arange(1000, 1000 + len(real))
    result = infill_spans(ids, mask, 0.3, np.random.default_rng(8), word_starts=word_starts)
    kept = result.ids[result.ids != mask] - 1000  # original positions, increasing
    assert (np.diff(kept) > 0).all()
    bounds = np.concatenate([[-1], kept, [len(ids)]])
    for before, after in zip(bounds[:-1], bounds[1:]):
        if after > before + 1:  # positions before+1 .. after-1 were removed
            assert word_starts[before + 1] or before + 1 == 0
            assert after == len(ids) or word_starts[after]


def test_infilling_random_tokens_replace_some_masks():
    docs, mask, _ = _documents()
    ids = np.concatenate([np.concatenate(d) for d in docs[:10]])
    result = infill_spans(ids, mask, 0.3, np.random.default_rng(4), random_ratio=1.0,
                          vocab_size=30522)
    assert not (result.ids == mask).any()  # every span and insertion became a random token
    assert len(result.ids) == (len(ids) - result.span_words.sum() + len(result.span_words)
                               + result.inserted)
    with pytest.raises(LmlabError, match="vocab_size"):
        infill_spans(ids, mask, 0.3, np.random.default_rng(4), random_ratio=0.5)


def test_sentence_permutation_keeps_the_sentences():
    docs, _, _ = _documents()
    doc = docs[2]
    out = permute_sentences(doc, np.random.default_rng(5))
    assert sorted(out.tolist()) == sorted(np.concatenate(doc).tolist())
    assert not np.array_equal(out, np.concatenate(doc))
    # the output is the sentences, whole, in some order
    rest, used = out.tolist(), []
    while rest:
        match = next(i for i, s in enumerate(doc) if i not in used
                     and rest[:len(s)] == s.tolist())
        used.append(match)
        rest = rest[len(doc[match]):]
    assert sorted(used) == list(range(len(doc)))


def test_document_rotation_is_a_rotation():
    docs, _, _ = _documents()
    ids = np.concatenate(docs[3])
    out = rotate_document(ids, np.random.default_rng(6))
    doubled = np.concatenate([ids, ids]).tolist()
    start = next(i for i in range(len(ids)) if doubled[i:i + len(ids)] == out.tolist())
    assert 0 < start < len(ids)  # a real rotation


def test_combination_is_deterministic_and_restorable_in_length_terms():
    docs, mask, starts = _documents()
    noise = BartNoise()  # BART-large: infilling 30%, Poisson(3.5), 10% random, permutation
    a = apply_noise(docs[4], noise, mask, np.random.default_rng(7), vocab_size=30522,
                    is_word_start=starts)
    b = apply_noise(docs[4], noise, mask, np.random.default_rng(7), vocab_size=30522,
                    is_word_start=starts)
    assert np.array_equal(a, b)
    original = np.concatenate(docs[4])
    assert len(a) < len(original)  # spans of about 4 words became one token each
    assert (a == mask).any()


def test_empty_document_is_refused():
    with pytest.raises(LmlabError, match="no sentences"):
        apply_noise([], BartNoise(permute_sentences=False), 4, np.random.default_rng(0))


@pytest.mark.parametrize("settings,match", [
    (dict(infill_ratio=1.5), "infill_ratio"),
    (dict(poisson_lambda=0), "poisson_lambda"),
    (dict(delete_ratio=-0.1), "delete_ratio"),
])
def test_bad_settings_are_refused(settings, match):
    with pytest.raises(LmlabError, match=match):
        BartNoise(**settings)
