"""The pretraining data path on real text: packing formats, BERT-style segment pairs,
determinism, workers, exact resume, fixed validation batches, and real token shards."""

from __future__ import annotations

import functools
import itertools
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import kjv_shards, minilm_raw_tokenizer

from lmlab.data.pretraining import (
    InMemoryTokenSource,
    PretrainingStream,
    create_segment_pairs,
    truncate_seq_pair,
    validation_batches,
)
from lmlab.data.shard_reader import ShardReader
from lmlab.objectives import SpecialTokens, build_objective, get_factory
from lmlab.objectives.base import Objective
from lmlab.utils.errors import LmlabError

_tokenizer = minilm_raw_tokenizer


@functools.lru_cache(maxsize=1)
def _kjv_docs() -> list[list[str]]:
    from lmlab.text.sources.kjv import KJVSource

    return [d.sentences for d in itertools.islice(KJVSource().iter_documents(), 60)]


@functools.lru_cache(maxsize=1)
def _source() -> InMemoryTokenSource:
    return InMemoryTokenSource.from_texts(_kjv_docs()[:30], _tokenizer())


@pytest.fixture(scope="module")
def special() -> SpecialTokens:
    return SpecialTokens.from_tokenizer(_tokenizer())


def _virtual_stream(source, sep_id: int) -> np.ndarray:
    """The split's tokens with a separator after each document (what FULL-SENTENCES packs)."""
    docs = source.document_offsets()
    parts = []
    for d in range(source.num_documents):
        parts.append(source.window(int(docs[d]), int(docs[d + 1] - docs[d])))
        parts.append(np.array([sep_id]))
    return np.concatenate(parts)


def _equal_batches(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(a, b))


# -------------------------------------------------------------------------------------- packing
def test_full_sentences_packing_covers_the_stream_in_order(special):
    source = _source()
    nsp = build_objective("nsp", special)  # no token corruption: inputs are the raw windows
    stream = PretrainingStream(source, objective=nsp, format="packed", batch_size=16,
                               seq_len=128, shuffle=False, infinite=False)
    pieces = []
    for batch in stream:
        for row in range(len(batch["input_ids"])):
            n = int(batch["attention_mask"][row].sum())
            ids = batch["input_ids"][row, :n]
            assert ids[0] == special.cls_id and ids[-1] == special.sep_id
            assert n == 128 or row == len(batch["input_ids"]) - 1  # only the last is short
            assert (batch["input_ids"][row, n:] == special.pad_id).all()
            pieces.append(ids[1:-1].numpy())
    assert np.array_equal(np.concatenate(pieces), _virtual_stream(source, special.sep_id))
    assert stream.tokens_seen == source.num_tokens + source.num_documents + 2 * len(pieces)


def test_document_respecting_packings(special):
    source = _source()
    docs = source.document_offsets()
    sentence_starts = set(source.sentence_offsets().tolist())
    nsp = build_objective("nsp", special)
    for packing in ("doc_windows", "doc_sentences"):
        stream = PretrainingStream(source, objective=nsp, format="packed", batch_size=32,
                                   seq_len=64, shuffle=False, infinite=False, packing=packing)
        starts, stops = stream._unit_start, stream._unit_stop
        assert (stops - starts <= 62).all() and (stops > starts).all()
        doc_of_start = np.searchsorted(docs, starts, side="right") - 1
        assert (stops <= docs[doc_of_start + 1]).all(), "a window crossed a document"
        total = 0
        for batch in stream:
            total += int(batch["attention_mask"].sum()) - 2 * len(batch["input_ids"])
            assert ((batch["input_ids"] == special.sep_id).sum(1) == 1).all()  # no doc joins
        assert total == source.num_tokens  # every token once, no document separators
        if packing == "doc_sentences":
            long_sentence_pieces = sum(1 for s in starts.tolist() if s not in sentence_starts)
            assert long_sentence_pieces < len(starts) // 10  # windows begin at sentences


class _DeclaredDecoderPacking(Objective):
    """No "clm" head, but decoder packing declared (identity corruption): the stream must follow
    the declaration, not the head names."""

    name, head_names, cls_sep_packing = "declared", ("mlm",), False


@pytest.mark.parametrize("make", [get_factory("clm"), _DeclaredDecoderPacking],
                         ids=["clm", "declared"])
def test_decoder_packing_has_no_cls(make, special):
    objective = make(special)
    stream = PretrainingStream(_source(), objective=objective, batch_size=4, seq_len=32,
                               shuffle=False, infinite=False)
    batch = next(iter(stream))
    assert batch["attention_mask"].all()
    assert not (batch["input_ids"] == special.cls_id).any()
    joined = batch["input_ids"].reshape(-1).numpy()
    assert np.array_equal(joined, _virtual_stream(_source(), special.sep_id)[:128])


# -------------------------------------------------------------------------------- segment pairs
@functools.lru_cache(maxsize=1)
def _kjv_sentences():
    source = InMemoryTokenSource.from_texts(_kjv_docs(), _tokenizer())
    docs, sentences = source.document_offsets(), source.sentence_offsets()
    result = []
    for d in range(source.num_documents):
        inside = sentences[(sentences >= docs[d]) & (sentences <= docs[d + 1])]
        result.append([(source.window(int(a), int(b - a)), source.word_starts(int(a), int(b - a)))
                       for a, b in zip(inside[:-1], inside[1:])])
    return result


def _occurrences(haystack: np.ndarray, needle: np.ndarray) -> list[int]:
    """Token indices where ``needle`` occurs in ``haystack`` (byte search, aligned hits)."""
    hay, pin = haystack.astype(np.int32).tobytes(), needle.astype(np.int32).tobytes()
    found, at = [], hay.find(pin)
    while at >= 0:
        if at % 4 == 0:
            found.append(at // 4)
        at = hay.find(pin, at + 1)
    return found


@pytest.mark.parametrize("mode", ["nsp", "sop"])
def test_segment_pairs_follow_bert(mode):
    docs = _kjv_sentences()
    flat = [np.concatenate([s[0] for s in doc]) for doc in docs]
    labels, lengths = [], []
    for index, doc in enumerate(docs[:40]):
        rng = random.Random(index)
        pairs = create_segment_pairs(doc, index, len(docs), lambda i: docs[i], 125, mode, rng)
        for pair in pairs:
            assert len(pair.tokens_a) and len(pair.tokens_b)
            assert len(pair.tokens_a) + len(pair.tokens_b) <= 125
            assert len(pair.starts_a) == len(pair.tokens_a)
            lengths.append(len(pair.tokens_a) + len(pair.tokens_b))
            labels.append(pair.label)
            home = flat[index]
            if mode == "nsp" and pair.label == 1:
                # A is this document's text; B was drawn from another document
                assert _occurrences(home, pair.tokens_a)
                assert any(_occurrences(flat[other], pair.tokens_b)
                           for other in range(len(docs)) if other != index)
            else:
                # A precedes B in the document (SOP label 1: B precedes A); truncation may
                # trim either end of each segment, so they are close but not always adjacent
                first, second = ((pair.tokens_a, pair.tokens_b) if pair.label == 0
                                 else (pair.tokens_b, pair.tokens_a))
                assert any(a + len(first) <= b <= a + len(first) + 125
                           for a in _occurrences(home, first)
                           for b in _occurrences(home, second))
    labels = np.array(labels)
    assert len(labels) > 300
    # SOP: a fair coin; NSP: a fair coin plus BERT's forced random B for one-sentence chunks
    assert 0.44 < labels.mean() < (0.56 if mode == "sop" else 0.62)
    # short_seq_prob = 0.1 makes about a tenth of the targets shorter
    assert np.mean(np.array(lengths) < 100) < 0.3


def test_truncate_seq_pair_cuts_the_longer_side():
    rng = random.Random(0)
    a, b = list(range(100)), list(range(10))
    keep_a, keep_b = truncate_seq_pair(a, b, 50, rng)
    assert (keep_a.stop - keep_a.start) + (keep_b.stop - keep_b.start) == 50
    assert keep_b == slice(0, 10)
    assert keep_a.start > 0 and keep_a.stop < 100  # both ends trimmed at random


@pytest.mark.parametrize("spec,key", [("mlm,nsp", "next_sentence_label"),
                                      ("mlm,sop", "sentence_order_label")])
def test_segment_pair_batches(spec, key, special):
    objective = build_objective(spec, special)
    stream = PretrainingStream(_source(), objective=objective, batch_size=32, seq_len=128)
    assert stream.format == "segment_pairs"
    labels = []
    for batch in itertools.islice(stream, 6):
        labels.extend(batch[key].tolist())
        for row in range(len(batch["input_ids"])):
            n = int(batch["attention_mask"][row].sum())
            types = batch["token_type_ids"][row, :n]
            raw_ids = torch.where(batch["labels"][row, :n] != -100, batch["labels"][row, :n],
                                  batch["input_ids"][row, :n])
            seps = (raw_ids == special.sep_id).nonzero().flatten().tolist()
            assert raw_ids[0] == special.cls_id and len(seps) == 2 and seps[1] == n - 1
            assert (types[:seps[0] + 1] == 0).all() and (types[seps[0] + 1:] == 1).all()
            assert (batch["token_type_ids"][row, n:] == 0).all()
    assert 0.35 < np.mean(labels) < 0.65


# ------------------------------------------------------------------------ determinism and state
@pytest.mark.parametrize("spec", ["mlm", "mlm,sop"])
def test_same_batches_for_any_worker_count(spec, special):
    objective = build_objective(spec, special)
    runs = []
    for workers in (0, 2):
        stream = PretrainingStream(_source(), objective=objective, batch_size=8, seq_len=64,
                                   seed=3, workers=workers)
        runs.append(list(itertools.islice(stream, 10)))
    assert _equal_batches(runs[0], runs[1])
    other = PretrainingStream(_source(), objective=objective, batch_size=8, seq_len=64, seed=4)
    assert not _equal_batches(runs[0], list(itertools.islice(other, 10)))


@pytest.mark.parametrize("spec,workers", [("mlm", 0), ("wwm", 2), ("mlm,nsp", 0), ("span", 1)])
def test_resume_yields_exactly_the_uninterrupted_batches(spec, workers, special):
    objective = build_objective(spec, special)

    def stream():
        return PretrainingStream(_source(), objective=objective, batch_size=16, seq_len=64,
                                 seed=11, workers=workers)

    # enough batches to cross an epoch boundary (16 x 64-token windows per batch)
    per_epoch = -(-stream().num_units // 16)
    cut = per_epoch - 2 if spec != "mlm,nsp" else 7
    uninterrupted = list(itertools.islice(stream(), cut + 6))
    first = stream()
    iterator = iter(first)
    taken = [next(iterator) for _ in range(cut)]
    state = json.loads(json.dumps(first.state_dict()))  # JSON-able
    resumed = stream()
    resumed.load_state_dict(state)
    assert resumed.tokens_seen == first.tokens_seen and resumed.epoch == first.epoch
    rest = list(itertools.islice(resumed, 6))
    assert _equal_batches(taken + rest, uninterrupted)
    if spec == "mlm":
        assert resumed.epoch == 1  # the resumed part crossed into the next epoch


def test_resume_refuses_another_configuration(special):
    objective = build_objective("mlm", special)
    a = PretrainingStream(_source(), objective=objective, batch_size=4, seq_len=64, seed=1)
    b = PretrainingStream(_source(), objective=objective, batch_size=4, seq_len=128, seed=1)
    with pytest.raises(LmlabError, match="seq_len"):
        b.load_state_dict(a.state_dict())


def test_epochs_reshuffle(special):
    objective = build_objective("mlm", special)
    stream = PretrainingStream(_source(), objective=objective, batch_size=16, seq_len=64)
    per_epoch = stream.num_units // 16
    orders: dict[int, list[int]] = {0: [], 1: []}
    for batch in itertools.islice(stream, 2 * per_epoch + 2):
        for e, i in zip(batch["epoch"].tolist(), batch["example_id"].tolist()):
            if e in orders:
                orders[e].append(i)
    assert sorted(orders[0]) == list(range(stream.num_units))
    assert orders[0] != orders[1] and orders[0] != sorted(orders[0])


def test_validation_batches_are_fixed(special):
    objective = build_objective("mlm", special)
    a = validation_batches(_source(), objective, batch_size=8, seq_len=64, max_batches=3,
                           split="train")
    b = validation_batches(_source(), objective, batch_size=8, seq_len=64, max_batches=3,
                           split="train")
    assert len(a) == 3 and _equal_batches(a, b)
    c = validation_batches(_source(), objective, batch_size=8, seq_len=64, max_batches=3,
                           seed=99, split="train")
    assert torch.equal(a[0]["example_id"], c[0]["example_id"])  # same examples, in order
    assert not torch.equal(a[0]["labels"], c[0]["labels"])  # other corruption seed


def test_errors_name_the_fix(special):
    objective = build_objective("mlm", special)
    with pytest.raises(LmlabError, match="does not exist"):
        PretrainingStream("/nonexistent/shards", objective=objective)
    with pytest.raises(LmlabError, match="unknown packing"):
        PretrainingStream(_source(), objective=objective, packing="full")
    with pytest.raises(LmlabError, match="too short"):
        PretrainingStream(_source(), objective=objective, seq_len=2)
    wrong = SpecialTokens(vocab_size=200, pad_id=0, cls_id=1, sep_id=2, mask_id=3)
    small = InMemoryTokenSource.from_sentences([[([5, 6, 7], [1, 1, 1])]], vocab_size=30522)
    with pytest.raises(LmlabError, match="vocabulary"):
        PretrainingStream(small, objective=build_objective("mlm", wrong))


# ------------------------------------------------------------------------------ real token shards
@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory) -> Path:
    """Shards of 40 + 10 KJV chapters (the same as _kjv_docs()[:50])."""
    return kjv_shards(tmp_path_factory, train=40, validation=10)


def test_stream_from_real_shards(shard_dir, special):
    source = ShardReader(shard_dir, "train")
    memory = InMemoryTokenSource.from_texts(_kjv_docs()[:40], _tokenizer())
    assert source.num_tokens == memory.num_tokens
    assert np.array_equal(source.document_offsets(), memory.document_offsets())
    assert np.array_equal(source.window(1000, 300), memory.window(1000, 300))
    assert np.array_equal(source.word_starts(0, 500), memory.word_starts(0, 500))

    for spec in ("wwm", "mlm,sop"):
        objective = build_objective(spec, special)
        from_shards = list(itertools.islice(
            PretrainingStream(shard_dir, objective=objective, batch_size=8, seq_len=128), 3))
        from_memory = list(itertools.islice(
            PretrainingStream(memory, objective=objective, batch_size=8, seq_len=128), 3))
        assert _equal_batches(from_shards, from_memory)
    val = validation_batches(shard_dir, build_objective("mlm", special), batch_size=8,
                             seq_len=128, max_batches=2)
    assert len(val) == 2 and int(val[0]["attention_mask"].sum()) == 8 * 128
