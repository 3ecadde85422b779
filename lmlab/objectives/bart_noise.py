"""BART's noising transforms (Lewis et al. 2020, Section 2.2) of one document's token ids, each
deterministic for its numpy generator; :func:`apply_noise` composes them in fairseq's order as
:class:`BartNoise` says (docs/objectives.md)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lmlab.objectives.masking import word_bounds
from lmlab.utils.checks import check_positive
from lmlab.utils.errors import LmlabError

MAX_SPAN = 128  # fairseq truncates the Poisson distribution here


def _check_ratio(name: str, value: float) -> float:
    if not 0.0 <= value <= 1.0:
        raise LmlabError(f"{name} {value} must be between 0 and 1",
                         "give a fraction, e.g. 0.3 for 30%")
    return value


def _random_positions(length: int, ratio: float, rng: np.random.Generator,
                      what: str) -> np.ndarray:
    """``ceil(ratio * length)`` distinct positions drawn uniformly."""
    _check_ratio(what, ratio)
    return rng.choice(length, size=int(math.ceil(ratio * length)), replace=False)


def mask_tokens(ids: np.ndarray, mask_id: int, ratio: float,
                rng: np.random.Generator) -> np.ndarray:
    """``ids`` with ``ceil(ratio * len)`` positions, drawn uniformly, set to ``mask_id``."""
    out = np.array(ids, copy=True)
    out[_random_positions(len(out), ratio, rng, "mask ratio")] = mask_id
    return out


def delete_tokens(ids: np.ndarray, ratio: float, rng: np.random.Generator) -> np.ndarray:
    """``ids`` without ``ceil(ratio * len)`` positions drawn uniformly (order kept)."""
    keep = np.ones(len(ids), dtype=bool)
    keep[_random_positions(len(ids), ratio, rng, "deletion ratio")] = False
    return np.asarray(ids)[keep]


def poisson_span_lengths(total: int, lam: float, rng: np.random.Generator) -> np.ndarray:
    """Span lengths drawn from Poisson(``lam``) (truncated at :data:`MAX_SPAN`) until they cover
    ``total`` units, the last one cut so that they sum to exactly ``total``, as fairseq's
    ``add_whole_word_mask`` does. Zero lengths are kept: they are insertions."""
    check_positive(lam, "poisson_lambda")
    lengths: list[int] = []
    covered = 0
    while covered < total:
        length = min(int(rng.poisson(lam)), MAX_SPAN)
        length = min(length, total - covered)
        lengths.append(length)
        covered += length
    return np.asarray(lengths, dtype=np.int64)


@dataclass(frozen=True)
class Infilling:
    """What :func:`infill_spans` did: the noised ids, the length (in words) of each span that
    one mask replaced, in order, and how many masks were inserted where nothing was removed."""

    ids: np.ndarray
    span_words: np.ndarray
    inserted: int


def _words(word_starts: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) token offsets of each word, by the same rule as MLM's whole-word masking
    (:func:`lmlab.objectives.masking.word_bounds`, every token a candidate)."""
    starts, ends = word_bounds(np.ones(len(word_starts), dtype=bool), word_starts)
    return list(zip(starts.tolist(), ends.tolist()))


def infill_spans(ids: np.ndarray, mask_id: int, ratio: float, rng: np.random.Generator,
                 poisson_lambda: float = 3.0, word_starts: np.ndarray | None = None,
                 random_ratio: float = 0.0, vocab_size: int | None = None) -> Infilling:
    """BART's text infilling: ``ceil(ratio * words)`` whole words in Poisson-length spans, each
    replaced by one ``mask_id`` (a random token with probability ``random_ratio``); a zero-length
    span inserts a mask. Spans never overlap or touch, unlike fairseq's (docs/objectives.md);
    ``word_starts`` (None: every token a word) keeps a word's pieces together."""
    _check_ratio("infilling ratio", ratio)
    _check_ratio("random_ratio", random_ratio)
    if random_ratio > 0 and not vocab_size:
        raise LmlabError("random_ratio needs vocab_size", "pass the tokenizer's vocabulary size")
    ids = np.asarray(ids)
    word_starts = np.ones(len(ids), bool) if word_starts is None else np.asarray(word_starts, bool)
    words = _words(word_starts)
    n = len(words)
    lengths = poisson_span_lengths(int(math.ceil(ratio * n)), poisson_lambda, rng)
    spans = [int(x) for x in lengths if x > 0]
    inserts = int((lengths == 0).sum())
    kept = n - sum(spans)
    while len(spans) > 1 and kept < len(spans) - 1:  # too few kept words to separate them
        spans[-2] += spans.pop()
    rng.shuffle(spans)
    # kept words between spans: one at least between two spans, the rest spread at random
    gaps = np.zeros(len(spans) + 1, dtype=np.int64)
    gaps[1:-1] = 1
    free = kept - max(len(spans) - 1, 0)
    gaps += rng.multinomial(free, np.full(len(gaps), 1.0 / len(gaps)))
    pieces: list[np.ndarray] = []
    piece_starts: list[np.ndarray] = []  # which output tokens begin a word
    word = 0

    def keep_words(count: int) -> None:
        nonlocal word
        if count:
            begin, end = words[word][0], words[word + count - 1][1]
            pieces.append(ids[begin:end])
            piece_starts.append(word_starts[begin:end].copy())
            piece_starts[-1][0] = True
            word += count

    def one_mask() -> np.ndarray:
        if random_ratio and rng.random() < random_ratio:
            return np.asarray([rng.integers(vocab_size)], dtype=ids.dtype)
        return np.asarray([mask_id], dtype=ids.dtype)

    for gap, span in zip(gaps[:-1], spans):
        keep_words(int(gap))
        pieces.append(one_mask())
        piece_starts.append(np.ones(1, dtype=bool))
        word += span
    keep_words(int(gaps[-1]))
    out = np.concatenate(pieces) if pieces else ids[:0]
    if inserts:
        # zero-length spans: a mask at distinct random word boundaries of the output
        starts = np.concatenate(piece_starts) if piece_starts else np.zeros(0, bool)
        boundaries = np.concatenate([np.flatnonzero(starts), [len(out)]])
        inserts = min(inserts, len(boundaries))
        where = np.sort(rng.choice(boundaries, size=inserts, replace=False))
        out = np.insert(out, where, np.concatenate([one_mask() for _ in range(inserts)]))
    return Infilling(out, np.asarray(spans, dtype=np.int64), inserts)


def permute_sentences(sentences: Sequence[np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """The document's sentences (each a token-id array) concatenated in a random order."""
    order = rng.permutation(len(sentences))
    return np.concatenate([np.asarray(sentences[i]) for i in order]) if len(sentences) else \
        np.zeros(0, dtype=np.int64)


def rotate_document(ids: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``ids`` rotated to start at a token drawn uniformly among all but the first."""
    ids = np.asarray(ids)
    if len(ids) < 2:
        return ids
    return np.roll(ids, -int(rng.integers(1, len(ids))))  # a real rotation, as fairseq's


@dataclass(frozen=True)
class BartNoise:
    """Which transforms :func:`apply_noise` applies, and how hard. The defaults are BART-large's
    pretraining (text infilling of 30% of the words with Poisson(3.5) spans, 10% of the masks
    random tokens, every document's sentences permuted)."""

    infill_ratio: float = 0.3
    poisson_lambda: float = 3.5
    random_ratio: float = 0.1
    mask_ratio: float = 0.0  # token masking (instead of, or besides, infilling)
    delete_ratio: float = 0.0
    permute_sentences: bool = True
    rotate: bool = False

    def __post_init__(self) -> None:
        for name in ("infill_ratio", "random_ratio", "mask_ratio", "delete_ratio"):
            _check_ratio(name, getattr(self, name))
        check_positive(self.poisson_lambda, "poisson_lambda")


def apply_noise(sentences: Sequence[np.ndarray], noise: BartNoise, mask_id: int,
                rng: np.random.Generator, vocab_size: int | None = None,
                is_word_start: np.ndarray | None = None,
                word_starts: Sequence[np.ndarray] | None = None) -> np.ndarray:
    """One document (its sentences' token ids) noised as ``noise`` says, in fairseq's order:
    sentence permutation, token masking, text infilling, deletion, rotation. The target is the
    original document. Infilling keeps words whole by ``word_starts`` (a bool per token of each
    sentence, as the shards store them), else ``is_word_start`` (a bool per vocabulary id:
    WordPiece's False for ``##`` pieces), else every token is a word."""
    if not len(sentences):
        raise LmlabError("the document has no sentences", "pass at least one sentence's ids")
    order = rng.permutation(len(sentences)) if noise.permute_sentences else range(len(sentences))
    ids = np.concatenate([np.asarray(sentences[i]) for i in order])
    starts = None
    if word_starts is not None:  # a sentence starts a word, wherever it is moved to
        starts = np.concatenate([np.r_[True, np.asarray(word_starts[i], bool)[1:]]
                                 for i in order])
    if noise.mask_ratio:
        ids = mask_tokens(ids, mask_id, noise.mask_ratio, rng)
    if noise.infill_ratio:
        if starts is None and is_word_start is not None:
            starts = np.asarray(is_word_start)[ids]
        ids = infill_spans(ids, mask_id, noise.infill_ratio, rng, noise.poisson_lambda,
                           starts, noise.random_ratio, vocab_size).ids
    if noise.delete_ratio:
        ids = delete_tokens(ids, noise.delete_ratio, rng)
    if noise.rotate:
        ids = rotate_document(ids, rng)
    return ids
