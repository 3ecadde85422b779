"""BART's objective reads the shards' sentences and words through the pretraining stream: its
sentence permutation permutes the window's sentences (not the packed documents cut at </s>),
and its text infilling removes whole words (spans start at word starts). KJV chapters in
MiniLM's WordPiece, each token's id replaced by its position (1000 + position) so that every
output token says where it came from."""

from __future__ import annotations

import dataclasses
import functools
import itertools

import numpy as np
import pytest
from conftest import minilm_raw_tokenizer

from lmlab.data.pretraining import InMemoryTokenSource, PretrainingStream
from lmlab.objectives.registry import build_objective
from lmlab.objectives.special_tokens import SpecialTokens

BASE, MASK, EOS = 1000, 3, 2


@functools.lru_cache(maxsize=1)
def _corpus():
    """(source, word starts by position, sentence starts by position, special tokens)."""
    from lmlab.text.sources.kjv import KJVSource

    tokenizer = minilm_raw_tokenizer()
    vocab = tokenizer.get_vocab()
    documents, position = [], BASE
    for document in itertools.islice(KJVSource().iter_documents(), 12):
        sentences = []
        for text in document.sentences:
            pieces = tokenizer.encode(text, add_special_tokens=False).tokens
            if not pieces:
                continue
            ids = np.arange(position, position + len(pieces))
            position += len(pieces)
            sentences.append((ids, np.asarray([not p.startswith("##") for p in pieces])))
        documents.append(sentences)
    source = InMemoryTokenSource.from_sentences(documents, vocab_size=position)
    words = np.zeros(position, dtype=bool)
    sentence_starts = np.zeros(position, dtype=bool)
    for sentences in documents:
        for ids, starts in sentences:
            words[ids] = starts
            sentence_starts[ids[0]] = True
    assert vocab["[MASK]"] not in (MASK,)  # our ids are our own: MASK 3, EOS 2
    special = SpecialTokens(vocab_size=position, pad_id=0, cls_id=1, sep_id=EOS, eos_id=EOS,
                            bos_id=1, mask_id=MASK)
    return source, words, sentence_starts, special


def _rows(packing: str, **args):
    """(noised input, original window) of each row of a few batches, without random tokens."""
    source, _, _, special = _corpus()
    objective = build_objective("bart", special, **args)
    objective.noise = dataclasses.replace(objective.noise, random_ratio=0.0)
    stream = PretrainingStream(source, objective=objective, batch_size=8, seq_len=512, seed=0,
                               packing=packing, shuffle=False, infinite=False)
    rows = []
    for batch in itertools.islice(stream, 4):
        for ids, mask, labels in zip(batch["input_ids"], batch["attention_mask"],
                                     batch["labels"]):
            rows.append((ids[mask.bool()].numpy()[:-1], labels[labels != -100].numpy()[:-1]))
    return rows


def _pieces(window: np.ndarray, sentence_starts: np.ndarray) -> list[tuple[int, ...]]:
    """The window cut before every token that begins a shard sentence (</s> ends its own)."""
    cuts = [i for i in range(1, len(window))
            if window[i] != EOS and sentence_starts[window[i]]]
    return [tuple(part.tolist()) for part in np.split(window, cuts)]


@pytest.mark.parametrize("packing", ["full_sentences", "doc_sentences"])
def test_sentence_permutation_permutes_the_shards_sentences(packing):
    _, _, sentence_starts, _ = _corpus()
    rows = _rows(packing, mask_ratio=0.0)
    identity = first_kept = several = 0
    expected_first = 0.0
    for noised, window in rows:
        pieces = _pieces(window, sentence_starts)
        # the output is the window's sentences, each whole, in some order
        order, at = [], 0
        remaining = list(range(len(pieces)))
        while at < len(noised):
            match = next(i for i in remaining
                         if tuple(noised[at:at + len(pieces[i])].tolist()) == pieces[i])
            remaining.remove(match)
            order.append(match)
            at += len(pieces[match])
        assert not remaining and sorted(order) == list(range(len(pieces)))
        if len(pieces) >= 3:
            several += 1
            identity += order == sorted(order)
            first_kept += order[0] == 0
            expected_first += 1 / len(pieces)
    # windows of 3+ sentences: a uniform permutation keeps the first one first 1/k of the time
    assert several >= 20
    assert identity <= 0.2 * several  # tol: 1/k! <= 1/6 in expectation
    assert abs(first_kept - expected_first) <= 3 * np.sqrt(expected_first) + 2  # tol: ~3 sigma


def test_infilling_spans_start_at_word_starts_and_remove_whole_words():
    _, words, _, _ = _corpus()
    assert (~words[BASE:]).mean() > 0.01  # words of several pieces: the test can fail
    rows = _rows("full_sentences", permute_sentences=False)
    removed_words = total_words = spans = 0
    for noised, window in rows:
        kept = noised[noised != MASK]
        position = {token: i for i, token in enumerate(window.tolist()) if token != EOS}
        where = np.asarray([position[t] if t != EOS else -1 for t in kept.tolist()])
        real = where >= 0
        assert (np.diff(where[real]) > 0).all()  # kept tokens keep their order
        bounds = np.concatenate([[-1], where[real], [len(window)]])
        window_starts = np.asarray([True if t == EOS else words[t] for t in window.tolist()])
        window_starts[0] = True  # a window may begin inside a word
        for before, after in zip(bounds[:-1], bounds[1:]):
            gone = window[before + 1:after]
            gone = gone[gone != EOS]
            if len(gone):
                spans += 1
                assert window_starts[before + 1]  # the span starts at a word start
                assert after == len(window) or window_starts[after]  # and ends at a word's end
                removed_words += int(window_starts[before + 1:after].sum())
        total_words += int(window_starts.sum())
    assert spans > 100
    assert removed_words / total_words == pytest.approx(0.3, abs=0.04)  # tol: ceil, ~2k words
