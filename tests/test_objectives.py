"""Corruption statistics and invariants of the pretraining objectives, on real text (KJV
chapters and WordNet glosses tokenized with the real MiniLM WordPiece tokenizer)."""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
import torch
from conftest import minilm_raw_tokenizer

from lmlab.data.pretraining import InMemoryTokenSource, PretrainingStream
from lmlab.objectives import SpecialTokens, available_objectives, build_objective
from lmlab.objectives.combined import CombinedObjective
from lmlab.objectives.masking import (
    IGNORE_INDEX,
    choose_spans,
    expected_span_length,
    span_length_distribution,
    word_bounds,
)
from lmlab.objectives.mlm import MaskedLM
from lmlab.utils.errors import LmlabError

_tokenizer = minilm_raw_tokenizer


@functools.lru_cache(maxsize=2)
def _source(kind: str) -> InMemoryTokenSource:
    if kind == "kjv":
        from lmlab.text.sources.kjv import KJVSource

        docs = [d.sentences for d in itertools.islice(KJVSource().iter_documents(), 40)]
    else:
        from lmlab.text.sources.wordnet import WordNetSource

        docs = [d.sentences for d in itertools.islice(WordNetSource().iter_documents(), 600)]
    return InMemoryTokenSource.from_texts(docs, _tokenizer())


@pytest.fixture(scope="module")
def special() -> SpecialTokens:
    return SpecialTokens.from_tokenizer(_tokenizer())


def _batches(objective, kind: str = "kjv", count: int = 4, batch_size: int = 64,
             seq_len: int = 128, seed: int = 0, **kwargs) -> list[dict[str, torch.Tensor]]:
    stream = PretrainingStream(_source(kind), objective=objective, batch_size=batch_size,
                               seq_len=seq_len, seed=seed, **kwargs)
    return list(itertools.islice(stream, count))


def _candidates(batch, special) -> torch.Tensor:
    specials = torch.tensor(special.special_ids)
    return batch["attention_mask"].bool() & ~torch.isin(batch["input_ids_original"], specials)


def _with_original(objective, batch_raw, rng_seed: int = 0):
    """Corrupt a raw batch, keeping the original ids for comparison."""
    rng = torch.Generator().manual_seed(rng_seed)
    out = objective.corrupt(batch_raw, rng)
    out["input_ids_original"] = batch_raw["input_ids"]
    return out


def _raw(kind: str = "kjv", batch_size: int = 64, seq_len: int = 128, count: int = 4,
         special=None, seed: int = 0):
    """Uncorrupted batches (identity objective: NSP's corrupt leaves tokens alone)."""
    identity = build_objective("nsp", special)
    stream = PretrainingStream(_source(kind), objective=identity, batch_size=batch_size,
                               seq_len=seq_len, seed=seed, format="packed")
    return list(itertools.islice(stream, count))


# ------------------------------------------------------------------------------- token masking
def test_mlm_rate_split_and_protected_tokens(special):
    mlm = build_objective("mlm", special)
    masked = mask_tok = random_tok = kept = 0
    for raw in _raw(special=special):
        out = _with_original(mlm, raw)
        labels, ids, orig = out["labels"], out["input_ids"], out["input_ids_original"]
        cand = _candidates(out, special)
        chosen = labels != IGNORE_INDEX
        # never a special token or padding; labels hold the original ids
        assert not (chosen & ~cand).any()
        assert torch.equal(labels[chosen], orig[chosen])
        # untouched elsewhere
        assert torch.equal(ids[~chosen], orig[~chosen])
        # BERT's exact budget per row
        for row in range(len(ids)):
            n = int(cand[row].sum())
            assert int(chosen[row].sum()) == max(1, round(0.15 * n))
        masked += int(chosen.sum())
        mask_tok += int((ids[chosen] == special.mask_id).sum())
        same = ids[chosen] == orig[chosen]
        kept += int(same.sum())
        random_tok += int(((ids[chosen] != special.mask_id) & ~same).sum())
        assert not torch.isin(ids[chosen & (ids != orig) & (ids != special.mask_id)],
                              torch.tensor(special.special_ids)).any()
    assert masked > 4000
    assert abs(mask_tok / masked - 0.8) < 0.025  # tol: sampling, over 4,000 positions
    assert abs(random_tok / masked - 0.1) < 0.02  # tol: sampling
    assert abs(kept / masked - 0.1) < 0.02  # tol: sampling; (a random draw equal to the original counts here)


def test_custom_rate_and_split(special):
    mlm = build_objective("mlm", special, mask_prob=0.4, replacement=(1.0, 0.0, 0.0))
    raw = _raw(special=special, count=1)[0]
    out = _with_original(mlm, raw)
    chosen = out["labels"] != IGNORE_INDEX
    rate = float(chosen.sum()) / float(_candidates(out, special).sum())
    assert abs(rate - 0.4) < 0.01  # tol: each row rounds 0.4 n
    assert (out["input_ids"][chosen] == special.mask_id).all()


def test_whole_word_masking_masks_every_piece(special):
    wwm = build_objective("wwm", special)
    multi_piece_words = 0
    total_chosen = total_cand = 0
    for raw in _raw("wordnet", special=special):
        out = _with_original(wwm, raw)
        chosen = (out["labels"] != IGNORE_INDEX).numpy()
        cand = _candidates(out, special).numpy()
        starts = raw["word_starts"].numpy()
        for row in range(len(chosen)):
            w_starts, w_ends = word_bounds(cand[row], starts[row])
            for s, e in zip(w_starts, w_ends):
                piece = chosen[row, s:e]
                assert piece.all() or not piece.any(), "a word was partly masked"
                if piece.all() and e - s > 1:
                    multi_piece_words += 1
            budget = max(1, round(0.15 * cand[row].sum()))
            assert chosen[row].sum() <= budget
        total_chosen += chosen.sum()
        total_cand += cand.sum()
    assert multi_piece_words > 20  # the test saw real multi-piece words
    assert 0.13 < total_chosen / total_cand <= 0.15


def test_word_bounds_follow_word_starts_not_hashes():
    # a byte-level-BPE-like row: word starts given explicitly, no '##' anywhere
    candidates = np.array([0, 1, 1, 1, 1, 1, 0, 0], dtype=bool)
    starts = np.array([1, 1, 0, 1, 0, 0, 1, 1], dtype=bool)
    s, e = word_bounds(candidates, starts)
    assert s.tolist() == [1, 3] and e.tolist() == [3, 6]
    # a window starting mid-word: the first candidate after [CLS] starts a word
    s, e = word_bounds(candidates, np.array([1, 0, 0, 1, 0, 0, 1, 1], dtype=bool))
    assert s.tolist() == [1, 3] and e.tolist() == [3, 6]


# --------------------------------------------------------------------------------- span masking
def test_span_length_distribution_mean():
    # geometric(0.2) truncated to 1..10 and renormalised: sum l q^(l-1) / sum q^(l-1)
    q = 0.8
    exact = (1 - 11 * q**10 + 10 * q**11) / (1 - q) ** 2 / ((1 - q**10) / (1 - q))
    assert expected_span_length(0.2, 10) == pytest.approx(exact, abs=1e-12)
    assert exact == pytest.approx(3.797, abs=1e-3)  # tol: 3 decimals (the paper: "3.8")
    lengths, probs = span_length_distribution(0.2, 10)
    draws = np.random.default_rng(0).choice(lengths, size=40_000, p=probs)
    assert abs(draws.mean() - exact) < 0.05  # tol: 40,000 draws, sd 0.013
    assert draws.min() == 1 and draws.max() == 10


def test_span_masking_whole_words_rate_and_per_span_replacement(special):
    span = build_objective("span", special)
    realized, rates, total_spans = [], [], 0
    for raw in _raw("wordnet", special=special, count=3):
        out = _with_original(span, raw)
        chosen = out["labels"] != IGNORE_INDEX
        cand = _candidates(out, special)
        starts = raw["word_starts"].numpy()
        ids = out["input_ids"]
        for row in range(len(ids)):
            rates.append(float(chosen[row].sum()) / max(1, round(0.15 * float(cand[row].sum()))))
            w_starts, w_ends = word_bounds(cand[row].numpy(), starts[row])
            for s, e in zip(w_starts, w_ends):
                piece = chosen[row, s:e]
                assert piece.all() or not piece.any()
        lefts, rights, offsets = out["sbo_left"], out["sbo_right"], out["sbo_offset"]
        for row in range(len(ids)):
            positions = chosen[row].nonzero().flatten().tolist()
            # group positions into spans by their (left, right) boundary pair
            spans: dict[tuple[int, int], list[int]] = {}
            for p in positions:
                spans.setdefault((int(lefts[row, p]), int(rights[row, p])), []).append(p)
            for (left, right), members in spans.items():
                assert members == list(range(left + 1, right))
                assert [int(offsets[row, p]) for p in members] == list(range(len(members)))
                is_mask = [int(ids[row, p]) == special.mask_id for p in members]
                assert all(is_mask) or not any(is_mask), "replacement decided per token"
                total_spans += 1
        lengths = out["span_lengths"]
        realized.extend(lengths[lengths > 0].tolist())
    assert total_spans > 200
    assert np.mean(rates) > 0.97  # the budget is (almost always) met exactly
    assert max(rates) <= 1.0
    assert 2.5 < np.mean(realized) < expected_span_length()  # budget/collisions cut spans short


def test_choose_spans_respects_special_tokens():
    rng = np.random.default_rng(1)
    candidates = np.ones(60, dtype=bool)
    candidates[[0, 30, 59]] = False  # [CLS] A [SEP] B [SEP]
    starts = np.ones(60, dtype=bool)
    for _ in range(50):
        chosen, spans = choose_spans(candidates, starts, 0.3, rng)
        assert not chosen[[0, 30, 59]].any()
        for first, end, _words in spans:
            assert not (first < 30 < end), "a span crossed [SEP]"


# ---------------------------------------------------------------------- static / dynamic masks
def _with_epoch(raw, epoch: int):
    batch = dict(raw)
    batch["epoch"] = torch.full_like(raw["epoch"], epoch)
    return batch


def test_static_masking_repeats_every_dupe_factor(special):
    static = build_objective("mlm", special, masking="static", dupe_factor=3, seed=7)
    raw = _raw(special=special, count=1, batch_size=16)[0]
    labels = [static.corrupt(_with_epoch(raw, e), torch.Generator().manual_seed(100 + e))
              ["labels"] for e in range(7)]
    assert torch.equal(labels[0], labels[3]) and torch.equal(labels[0], labels[6])
    assert torch.equal(labels[1], labels[4])
    assert not torch.equal(labels[0], labels[1])
    assert not torch.equal(labels[1], labels[2])
    # the mask belongs to the example, not to its place in the batch
    flipped = {k: (v.flip(0) if v.dim() else v) for k, v in _with_epoch(raw, 0).items()}
    again = static.corrupt(flipped, torch.Generator().manual_seed(5))["labels"]
    assert torch.equal(again.flip(0), labels[0])
    assert static.data_epoch(5) == 2


def test_dynamic_masking_differs_per_epoch_and_is_seeded(special):
    dynamic = build_objective("mlm", special)
    stream_batches = {}
    for seed in (0, 0, 1):
        stream = PretrainingStream(_source("kjv"), objective=dynamic, batch_size=16,
                                   seq_len=64, seed=seed)
        per_example: dict[tuple[int, int], torch.Tensor] = {}
        for batch in itertools.islice(stream, 3 * (-(-stream.num_units // 16)) + 1):
            for row in range(len(batch["example_id"])):
                key = (int(batch["epoch"][row]), int(batch["example_id"][row]))
                per_example[key] = batch["labels"][row]
        stream_batches.setdefault(seed, []).append(per_example)
    first, repeat = stream_batches[0]
    assert first.keys() == repeat.keys()
    assert all(torch.equal(first[k], repeat[k]) for k in first)  # deterministic for a seed
    same_across_epochs = sum(torch.equal(first[(0, i)], first[(1, i)])
                             for e, i in first if e == 0 and (1, i) in first)
    assert same_across_epochs == 0  # fresh masks every epoch (RoBERTa)
    other = stream_batches[1][0]
    assert sum(torch.equal(first[k], other[k]) for k in first if k in other) == 0


def test_static_masking_through_the_stream(special):
    static = build_objective("mlm", special, masking="static", dupe_factor=2)
    stream = PretrainingStream(_source("kjv"), objective=static, batch_size=16, seq_len=64)
    per_example: dict[tuple[int, int], torch.Tensor] = {}
    for batch in itertools.islice(stream, 3 * (-(-stream.num_units // 16)) + 1):
        for row in range(len(batch["example_id"])):
            key = (int(batch["epoch"][row]), int(batch["example_id"][row]))
            per_example[key] = batch["labels"][row]
    ids = [i for e, i in per_example if e == 0 and (2, i) in per_example]
    assert len(ids) > 50
    assert all(torch.equal(per_example[(0, i)], per_example[(2, i)]) for i in ids)
    assert sum(torch.equal(per_example[(0, i)], per_example[(1, i)]) for i in ids) == 0


# ----------------------------------------------------------------------------------- registry
class _Solo(MaskedLM):
    """A masked LM that declares it cannot share a forward pass (as ELECTRA does)."""

    name, shares_forward_pass = "solo", False


def test_registry_and_composition(special):
    assert {"mlm", "wwm", "span", "nsp", "sop", "rtd"} <= set(available_objectives())
    combined = build_objective("mlm,sop", special, mask_prob=0.2)
    assert combined.name == "mlm,sop"
    assert combined.head_names == ("mlm", "sop")
    assert combined.example_format == "segment_pairs"
    assert combined.components[0].mask_prob == 0.2
    span = build_objective("span", special, **{"span.max_span_length": 5})
    assert span.max_span_length == 5 and span.head_names == ("mlm", "sbo")
    with pytest.raises(LmlabError, match="not used"):
        build_objective("mlm", special, mask_probability=0.2)
    with pytest.raises(LmlabError, match="unknown objective"):
        build_objective("reformer", special)
    with pytest.raises(LmlabError, match="both corrupt"):
        build_objective("mlm,span", special)
    with pytest.raises(LmlabError, match="both classify"):
        build_objective("nsp,sop", special)
    with pytest.raises(LmlabError, match="cannot share"):
        build_objective("rtd,sop", special)
    with pytest.raises(LmlabError, match="cannot share"):  # declared, whatever the name
        CombinedObjective([_Solo(special), build_objective("sop", special)])
    with pytest.raises(LmlabError, match="summing to 1"):
        build_objective("mlm", special, replacement=(0.8, 0.1, 0.2))


def test_objectives_declare_what_data_and_training_need(special):
    """Encoders pack [CLS] ... [SEP], decoders bare windows; a combination with a decoder
    component packs as a decoder."""
    names = ("mlm", "wwm", "span", "nsp", "sop", "rtd", "clm", "prefix-lm")
    packing = {name: build_objective(name, special).cls_sep_packing for name in names}
    assert packing == {**dict.fromkeys(names, True), "clm": False, "prefix-lm": False}
    assert build_objective("mlm,sop", special).cls_sep_packing
    assert not CombinedObjective([build_objective("clm", special),
                                  build_objective("nsp", special)]).cls_sep_packing
    assert [build_objective(n, special).shares_forward_pass for n in ("mlm", "clm", "rtd")] == \
        [True, True, False]


def test_register_objective_opens_the_registry(special, monkeypatch):
    from lmlab.objectives import register_objective, registry
    from lmlab.objectives.mlm import MaskedLM

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # no leak to others

    class HalfMasked(MaskedLM):
        name = "half"

    register_objective("half-test", lambda sp, **kw: HalfMasked(sp, mask_prob=0.5, **kw))
    objective = build_objective("half-test", special, masking="static")
    assert objective.mask_prob == 0.5 and objective.static


def test_special_tokens_from_lmlab_tokenizer(minilm_dir, special):
    from lmlab.tokenization.tokenizer import Tokenizer

    from_lmlab = SpecialTokens.from_tokenizer(Tokenizer.from_pretrained(minilm_dir))
    assert (from_lmlab.cls_id, from_lmlab.sep_id, from_lmlab.mask_id, from_lmlab.pad_id) == \
        (special.cls_id, special.sep_id, special.mask_id, special.pad_id) == (101, 102, 103, 0)
    assert set(from_lmlab.special_ids) == set(special.special_ids)
    assert SpecialTokens.from_dict(special.to_dict()) == special
    with pytest.raises(LmlabError, match="outside the vocabulary"):
        SpecialTokens(vocab_size=10, pad_id=0, cls_id=1, sep_id=2, mask_id=30)
