"""Word-word co-occurrence counts with GloVe's distance weighting (Pennington et al. 2014).

Two vocabulary words ``d`` positions apart in a sentence (``d <= window``, out-of-vocabulary
words dropped first) add ``1 / d`` to their count in both directions, as ``cooccur -symmetric
1`` does. Memory is bounded by the vocabulary: a sorted sparse table of the distinct pairs
``i <= j`` (12 bytes each) and a buffer of ``buffer_pairs`` fresh pairs merged into it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from lmlab.utils.checks import check_at_least
from lmlab.vectors.sentences import word_chunks


@dataclass
class Cooccurrences:
    """The non-zero upper triangle of the symmetric co-occurrence matrix: ``rows <= cols``,
    ``values[k] = X[rows[k], cols[k]]`` (float64), over a vocabulary of ``size`` words."""

    rows: np.ndarray
    cols: np.ndarray
    values: np.ndarray
    size: int

    def __len__(self) -> int:
        return len(self.values)

    def dense(self) -> np.ndarray:
        """The full (V, V) matrix (small vocabularies only: tests and inspection)."""
        matrix = np.zeros((self.size, self.size))
        matrix[self.rows, self.cols] = self.values
        matrix[self.cols, self.rows] = self.values
        return matrix

    def entries(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every non-zero ``(i, j, X[i, j])`` of the full matrix: both directions of each pair."""
        off = self.rows != self.cols
        return (np.concatenate([self.rows, self.cols[off]]),
                np.concatenate([self.cols, self.rows[off]]),
                np.concatenate([self.values, self.values[off]]))


class _SparseSum:
    """A sorted sparse accumulator: keys (int64) -> summed weights, merged in batches."""

    def __init__(self, buffer_pairs: int):
        self.keys = np.empty(0, dtype=np.int64)
        self.values = np.empty(0, dtype=np.float64)
        self.buffer_pairs = buffer_pairs
        self.pending_keys: list[np.ndarray] = []
        self.pending_values: list[np.ndarray] = []
        self.pending = 0

    def add(self, keys: np.ndarray, values: np.ndarray) -> None:
        self.pending_keys.append(keys)
        self.pending_values.append(values)
        self.pending += len(keys)
        if self.pending >= self.buffer_pairs:
            self.merge()

    def merge(self) -> None:
        if not self.pending:
            return
        keys = np.concatenate([self.keys, *self.pending_keys])
        values = np.concatenate([self.values, *self.pending_values])
        unique, slot = np.unique(keys, return_inverse=True)
        self.keys, self.values = unique, np.bincount(slot, weights=values, minlength=len(unique))
        self.pending_keys, self.pending_values, self.pending = [], [], 0


def count_cooccurrences(sentences: Iterable[list[str]], index: dict[str, int], window: int = 10,
                        buffer_pairs: int = 10_000_000, chunk_words: int = 100_000
                        ) -> Cooccurrences:
    """The distance-weighted symmetric co-occurrence counts of ``sentences`` (word lists) over
    the words of ``index`` (word -> row), streamed: one pass, memory as the module says."""
    check_at_least(window, 1, "window")
    check_at_least(buffer_pairs, 1, "buffer_pairs")
    check_at_least(chunk_words, 1, "chunk_words")
    size = len(index)
    table = _SparseSum(buffer_pairs)
    for ids, sentence_of, _ in word_chunks(sentences, index, chunk_words):
        _add_chunk(table, ids, sentence_of, window, size)
    table.merge()
    rows, cols = np.divmod(table.keys, size)
    return Cooccurrences(rows, cols, table.values, size)


def _add_chunk(table: _SparseSum, ids: np.ndarray, sentence_of: np.ndarray, window: int,
               size: int) -> None:
    """Add the pairs of one run of sentences (``ids``: word rows, ``sentence_of``: sentence
    number of each) to ``table``, keyed ``min * V + max`` with weight 1 / distance (2 / distance
    for a word and itself)."""
    for distance in range(1, window + 1):
        left, right = ids[:-distance], ids[distance:]
        same = sentence_of[:-distance] == sentence_of[distance:]
        left, right = left[same], right[same]
        low, high = np.minimum(left, right), np.maximum(left, right)
        weights = np.where(low == high, 2.0, 1.0) / distance
        table.add(low * size + high, weights)
