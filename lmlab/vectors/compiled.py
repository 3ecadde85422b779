"""The per-example training loops of word2vec and GloVe, compiled with numba.

gensim and the C tools update after every example in compiled loops; these are the same loops.
Every function here releases the GIL (``nogil``), so several Python threads run it at once on
shared tables without locks (Hogwild, Recht et al. 2011: gensim's ``workers``, ``glove.c``'s
threads). word2vec follows gensim's ``word2vec_inner.pyx`` line by line (its 48-bit random
generator, subsampling integers and cumulative noise table, so that fed gensim's sigmoid table
a pass gives gensim's tables: tested), with a sigmoid table read at each bin's centre instead
of gensim's ``int((x + 6) * 83)``. GloVe follows ``glove.c``'s AdaGrad loop in float64.
Compiled on first use and cached beside this file (``cache=True``; numba falls back to a
per-user cache folder when that is not writable).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

MAX_EXP = 6.0  # the sigmoid table's reach (the C tool's and gensim's)
TABLE_SIZE = 1000
_LCG_MULTIPLIER = np.uint64(25214903917)
_LCG_MASK = np.uint64(2**48 - 1)
_JIT = {"nogil": True, "cache": True, "fastmath": True, "error_model": "numpy"}


def sigmoid_tables(size: int = TABLE_SIZE) -> tuple[np.ndarray, np.ndarray, float]:
    """The sigmoid and the log-sigmoid at the centres of ``size`` bins over
    ``[-MAX_EXP, MAX_EXP)`` (float32), and the scale that maps ``x + MAX_EXP`` to a bin."""
    x = (np.arange(size) + 0.5) / size * 2 * MAX_EXP - MAX_EXP
    return ((1 / (1 + np.exp(-x))).astype(np.float32), (-np.logaddexp(0, -x)).astype(np.float32),
            size / (2 * MAX_EXP))


@njit(**_JIT)
def _next(state):
    """gensim's and the C tool's 48-bit linear congruential generator."""
    return (state * _LCG_MULTIPLIER + np.uint64(11)) & _LCG_MASK


def noise_guide(cum_table: np.ndarray) -> tuple[np.ndarray, int]:
    """A guide to ``cum_table`` (Chen & Asau 1974): for the draws ``v`` with ``v >> shift == b``
    the answer lies in ``guide[b]..guide[b + 1]``, a range of a word or two, so a draw searches
    there instead of the whole table, with the same result as a search of all of it."""
    total = int(cum_table[-1])
    shift = max(0, total.bit_length() - max(10, len(cum_table).bit_length()))
    starts = np.arange((total >> shift) + 2, dtype=np.int64) << shift
    return np.searchsorted(cum_table, starts, side="left").astype(np.int64), shift


@njit(**_JIT)
def _draw(cum_table, guide, shift, state):
    """gensim's noise draw, ``bisect_left(cum_table, (state >> 16) % cum_table[-1])``, searched
    within the guide's range."""
    value = (state >> np.uint64(16)) % np.uint64(cum_table[-1])
    bucket = value >> np.uint64(shift)
    low, high = guide[bucket], guide[bucket + 1]
    while high > low:
        middle = (low + high) >> 1
        if cum_table[middle] >= value:
            high = middle
        else:
            low = middle + 1
    return low


@njit(inline="always", **_JIT)
def _negative_sampling(hidden, h, syn1, word, work, cum_table, guide, shift, negative, alpha,
                       state, sigmoid, log_sigmoid, scale):
    """One example: row ``h`` of ``hidden`` predicts ``word`` against ``negative`` noise words
    drawn from ``cum_table`` (a draw equal to ``word`` is skipped). Steps the output rows in
    turn, summing into ``work`` the input step (``g`` times each output row before its update).
    A score beyond ``+-MAX_EXP`` steps nothing (gensim's rule) but counts in the loss.
    Returns the loss and the generator's state. (Rows are indexed, never sliced: a slice is a
    reference-counted view, and threads counting on one table's counter queue for it.)"""
    dim = work.shape[0]
    for a in range(dim):
        work[a] = 0.0
    loss = 0.0
    last = len(sigmoid) - 1
    for d in range(negative + 1):
        if d == 0:
            target, label = word, np.float32(1.0)
        else:
            target = _draw(cum_table, guide, shift, state)
            state = _next(state)
            if target == word:
                continue
            label = np.float32(0.0)
        f = np.float32(0.0)
        for a in range(dim):
            f += hidden[h, a] * syn1[target, a]
        signed = f if d == 0 else -f
        if signed <= -MAX_EXP:
            loss -= signed
        elif signed < MAX_EXP:
            loss -= log_sigmoid[min(int((signed + MAX_EXP) * scale), last)]
        if f <= -MAX_EXP or f >= MAX_EXP:
            continue  # gensim's rule: no step beyond the table (the C tool steps saturated)
        g = (label - sigmoid[min(int((f + MAX_EXP) * scale), last)]) * alpha
        for a in range(dim):
            work[a] += g * syn1[target, a]
            syn1[target, a] += g * hidden[h, a]
    return loss, state


@njit(**_JIT)
def _subsample(ids, sentence_of, keep, state):
    """The kept words (gensim's rule: a word stays when its ``keep`` integer is at least the
    next 32-bit draw; ``keep`` empty: every word stays), their sentence numbers and positions."""
    kept = np.empty(len(ids), np.int64)
    sentence = np.empty(len(ids), np.int64)
    position = np.empty(len(ids), np.int64)
    m = 0
    for p in range(len(ids)):
        if len(keep):
            draw = (state >> np.uint64(16)) & np.uint64(0xFFFFFFFF)
            state = _next(state)
            if keep[ids[p]] < draw:
                continue
        kept[m], sentence[m], position[m] = ids[p], sentence_of[p], p
        m += 1
    return kept[:m], sentence[:m], position[:m], state


@njit(**_JIT)
def word2vec_chunk(syn0, syn1, ids, sentence_of, keep, cum_table, guide, shift, reach, cbow,
                   negative, alpha_from, alpha_to, state, sigmoid, log_sigmoid, scale):
    """Skip-gram or CBOW (``cbow``, mean of the context) with negative sampling over one chunk
    of words (``ids``, each with its ``sentence_of``), as gensim's ``train_batch_sg`` /
    ``train_batch_cbow``: subsampling first, then each kept word's window of ``reach[k]``
    kept words each side within its sentence; the rate falls linearly from ``alpha_from`` at the
    chunk's first word to ``alpha_to`` after its last. Returns (summed loss, examples, state)."""
    kept, sentence, position, state = _subsample(ids, sentence_of, keep, np.uint64(state))
    dim, n, m = syn0.shape[1], len(ids), len(kept)
    work = np.empty(dim, np.float32)
    hidden = np.empty((1, dim), np.float32)  # CBOW's mean of the context rows
    loss, examples, start = 0.0, 0, 0
    while start < m:
        end = start + 1
        while end < m and sentence[end] == sentence[start]:
            end += 1
        for i in range(start, end):
            alpha = np.float32(alpha_from + (alpha_to - alpha_from) * position[i] / n)
            low, high = max(start, i - reach[i]), min(end, i + reach[i] + 1)
            if cbow:
                for a in range(dim):
                    hidden[0, a] = 0.0
                for j in range(low, high):
                    if j != i:
                        row = kept[j]  # a local: the inner loops vectorise
                        for a in range(dim):
                            hidden[0, a] += syn0[row, a]
                if high - low > 1:
                    inverse = np.float32(1.0) / np.float32(high - low - 1)
                    for a in range(dim):
                        hidden[0, a] *= inverse
                step, state = _negative_sampling(hidden, 0, syn1, kept[i], work, cum_table,
                                                 guide, shift, negative, alpha, state, sigmoid,
                                                 log_sigmoid, scale)
                loss += step
                examples += 1
                for j in range(low, high):
                    if j != i:
                        row = kept[j]
                        for a in range(dim):
                            syn0[row, a] += work[a]
            else:
                for j in range(low, high):
                    if j == i:
                        continue
                    row = kept[j]
                    step, state = _negative_sampling(syn0, row, syn1, kept[i], work, cum_table,
                                                     guide, shift, negative, alpha, state,
                                                     sigmoid, log_sigmoid, scale)
                    loss += step
                    examples += 1
                    for a in range(dim):
                        syn0[row, a] += work[a]
        start = end
    return loss, examples, state


@njit(**_JIT)
def glove_entries(words, contexts, word_bias, context_bias, sums, bias_sums, rows, cols,
                  log_x, weight, order, start, stop, learning_rate, clip):
    """``glove.c``'s AdaGrad loop over the entries ``order[start:stop]``: for entry ``e`` at
    ``(rows[e], cols[e])``, the weighted residual of ``w . w~ + b + b~ - log X``, gradients
    clipped to ``+-clip``, each step divided by the root of its squared-gradient sum before the
    sum grows (``sums``: the words' and contexts' (2, V, D), ``bias_sums`` (2, V)). Returns the
    summed loss ``f(X) (residual)^2 / 2`` before each step."""
    loss = 0.0
    dim = words.shape[1]
    for t in range(start, stop):
        e = order[t]
        i, j = rows[e], cols[e]
        diff = word_bias[i] + context_bias[j] - log_x[e]
        for a in range(dim):
            diff += words[i, a] * contexts[j, a]
        fdiff = weight[e] * diff
        loss += 0.5 * fdiff * diff
        fdiff *= learning_rate
        for a in range(dim):
            grad_w = min(max(fdiff * contexts[j, a], -clip), clip)
            grad_c = min(max(fdiff * words[i, a], -clip), clip)
            words[i, a] -= grad_w / math.sqrt(sums[0, i, a])
            contexts[j, a] -= grad_c / math.sqrt(sums[1, j, a])
            sums[0, i, a] += grad_w * grad_w
            sums[1, j, a] += grad_c * grad_c
        word_bias[i] -= fdiff / math.sqrt(bias_sums[0, i])
        context_bias[j] -= fdiff / math.sqrt(bias_sums[1, j])
        bias_sums[0, i] += fdiff * fdiff
        bias_sums[1, j] += fdiff * fdiff
    return loss
