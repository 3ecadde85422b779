"""Which tokens to corrupt, and how: token, whole-word and span masking and the 80/10/10
replacement, one row at a time (numpy, collate time). "Candidates" are the real, non-special
tokens; docs/objectives.md gives each scheme's rules and statistics."""

from __future__ import annotations

import numpy as np

from lmlab.utils.errors import LmlabError

IGNORE_INDEX = -100


def check_split(split: tuple[float, float, float]) -> tuple[float, float, float]:
    """Validate a (mask, random, keep) replacement split; returns it as floats."""
    values = tuple(float(v) for v in split)
    if len(values) != 3 or min(values) < 0 or abs(sum(values) - 1.0) > 1e-6:
        raise LmlabError(f"replacement split {split!r} is not three probabilities summing to 1",
                         "give (mask, random, keep), e.g. (0.8, 0.1, 0.1) as BERT did")
    return values  # type: ignore[return-value]


def check_rate(rate: float) -> float:
    """Validate a masking rate in (0, 1)."""
    if not 0.0 < rate < 1.0:
        raise LmlabError(f"masking rate {rate} is not in (0, 1)",
                         "use a rate like 0.15 (BERT), 0.4 (Wettig et al. 2023)")
    return float(rate)


def num_to_mask(num_candidates: int, rate: float, max_predictions: int | None = None) -> int:
    """BERT's budget: ``max(1, round(rate * n))`` capped by ``max_predictions`` and ``n``."""
    if num_candidates <= 0:
        return 0
    count = max(1, int(round(num_candidates * rate)))
    if max_predictions is not None:
        count = min(count, max_predictions)
    return min(count, num_candidates)


def choose_tokens(candidates: np.ndarray, rate: float, rng: np.random.Generator,
                  max_predictions: int | None = None) -> np.ndarray:
    """Boolean mask (T,) of exactly ``num_to_mask`` candidate positions, chosen uniformly."""
    index = np.flatnonzero(candidates)
    chosen = np.zeros(candidates.shape, dtype=bool)
    count = num_to_mask(len(index), rate, max_predictions)
    if count:
        chosen[rng.choice(index, size=count, replace=False)] = True
    return chosen


def word_bounds(candidates: np.ndarray, word_starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the words made of candidate tokens (end exclusive): a word starts at a
    flagged ``word_starts`` token or at a candidate after a non-candidate (a window may begin
    mid-word; a special token ends a word) and runs over the following non-start candidates."""
    candidates = np.asarray(candidates, dtype=bool)
    previous = np.concatenate([[False], candidates[:-1]])
    is_start = candidates & (np.asarray(word_starts, dtype=bool) | ~previous)
    starts = np.flatnonzero(is_start)
    stops = np.flatnonzero(is_start | ~candidates)
    after = np.searchsorted(stops, starts, side="right")
    ends = np.where(after < len(stops), stops[np.minimum(after, len(stops) - 1)],
                    len(candidates))
    return starts, ends


def choose_whole_words(candidates: np.ndarray, word_starts: np.ndarray, rate: float,
                       rng: np.random.Generator,
                       max_predictions: int | None = None) -> np.ndarray:
    """Boolean mask (T,) of whole words, visited in random order and kept while they fit the
    budget (a word that would overshoot is skipped, as BERT's ``do_whole_word_mask``)."""
    starts, ends = word_bounds(candidates, word_starts)
    budget = num_to_mask(int(np.count_nonzero(candidates)), rate, max_predictions)
    chosen = np.zeros(len(candidates), dtype=bool)
    count = 0
    for word in rng.permutation(len(starts)):
        if count >= budget:
            break
        size = int(ends[word] - starts[word])
        if count + size > budget:
            continue
        chosen[starts[word]:ends[word]] = True
        count += size
    return chosen


def span_length_distribution(p: float = 0.2, max_length: int = 10,
                             min_length: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, probabilities) of SpanBERT's span lengths: geometric(p) truncated to
    [min_length, max_length] and renormalised (as SpanBERT's code does)."""
    if not 0.0 < p <= 1.0 or not 1 <= min_length <= max_length:
        raise LmlabError(f"span length distribution p={p}, lengths [{min_length}, {max_length}] "
                         "is not valid", "use 0 < p <= 1 and 1 <= min_length <= max_length")
    lengths = np.arange(min_length, max_length + 1)
    weights = p * (1.0 - p) ** (lengths - min_length)
    return lengths, weights / weights.sum()


def expected_span_length(p: float = 0.2, max_length: int = 10, min_length: int = 1) -> float:
    """Mean span length in words (3.797 for SpanBERT's p = 0.2, lengths 1..10)."""
    lengths, probs = span_length_distribution(p, max_length, min_length)
    return float((lengths * probs).sum())


def choose_spans(candidates: np.ndarray, word_starts: np.ndarray, rate: float,
                 rng: np.random.Generator, p: float = 0.2, max_length: int = 10,
                 min_length: int = 1,
                 max_predictions: int | None = None) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
    """SpanBERT span masking of one row (docs/objectives.md): spans of whole words with
    geometric lengths at random start words until the budget is met. Returns the mask (T,) and
    each span's ``(first_token, end_exclusive, num_words)`` in draw order."""
    starts, ends = word_bounds(candidates, word_starts)
    lengths, probs = span_length_distribution(p, max_length, min_length)
    budget = num_to_mask(int(np.count_nonzero(candidates)), rate, max_predictions)
    chosen = np.zeros(len(candidates), dtype=bool)
    spans: list[tuple[int, int, int]] = []
    num_words = len(starts)
    if budget == 0 or num_words == 0:
        return chosen, spans
    taken = np.zeros(num_words, dtype=bool)
    sizes = ends - starts
    count, tries = 0, 0
    # Each try either masks a word or fails; failures only happen near the budget or when the
    # row is crowded, so a generous cap on tries ends the loop without changing the statistics.
    max_tries = 20 * num_words + 100
    cumulative = np.cumsum(probs)
    chunk = max(8, budget)  # draws come in chunks: most rows need about budget / 3.8 of them
    drawn_lengths = drawn_words = np.zeros(0, dtype=np.int64)
    while count < budget and tries < max_tries:
        slot = tries % chunk
        if slot == 0:
            drawn_lengths = lengths[np.minimum(np.searchsorted(cumulative, rng.random(chunk),
                                                               side="right"), len(lengths) - 1)]
            drawn_words = rng.integers(0, num_words, size=chunk)
        length, word = int(drawn_lengths[slot]), int(drawn_words[slot])
        tries += 1
        if taken[word] or count + sizes[word] > budget:
            continue
        first, words = word, 0
        while (words < length and word < num_words and not taken[word]
               and count + sizes[word] <= budget
               and (word == first or starts[word] == ends[word - 1])):
            taken[word] = True
            chosen[starts[word]:ends[word]] = True
            count += int(sizes[word])
            words += 1
            word += 1
        spans.append((int(starts[first]), int(ends[word - 1]), words))
    return chosen, spans


def replace_tokens(ids: np.ndarray, chosen: np.ndarray, split: tuple[float, float, float],
                   rng: np.random.Generator, mask_id: int, random_pool: np.ndarray,
                   groups: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Corrupted ids (T,) and labels (T,; -100 where not chosen) of one row: each ``chosen``
    position becomes [MASK], a token from ``random_pool`` or itself by ``split``; positions
    sharing a ``groups`` value share one decision (SpanBERT's per-span choice)."""
    mask_p, random_p, _ = split
    positions = np.flatnonzero(chosen)
    labels = np.full(ids.shape, IGNORE_INDEX, dtype=np.int64)
    labels[positions] = ids[positions]
    corrupted = ids.astype(np.int64, copy=True)
    if len(positions) == 0:
        return corrupted, labels
    if groups is None:
        u = rng.random(len(positions))
    else:
        group_ids = groups[positions]
        _, inverse = np.unique(group_ids, return_inverse=True)
        u = rng.random(int(inverse.max()) + 1)[inverse]
    to_mask = positions[u < mask_p]
    to_random = positions[(u >= mask_p) & (u < mask_p + random_p)]
    corrupted[to_mask] = mask_id
    if len(to_random):
        corrupted[to_random] = rng.choice(random_pool, size=len(to_random))
    return corrupted, labels


def candidate_mask(ids: np.ndarray, attention_mask: np.ndarray,
                   special_ids: np.ndarray) -> np.ndarray:
    """Positions that may be masked: real tokens that are not special tokens."""
    return attention_mask.astype(bool) & ~np.isin(ids, special_ids)


def row_rng(*entropy: int) -> np.random.Generator:
    """A numpy generator seeded from integers (seed, example id, epoch, salt ...)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(e) for e in entropy])))
