"""Training static word vectors: word2vec's subsampling and noise tables (against the formulas
and gensim's own tables), its init and whole passes of its compiled loop (against gensim's
compiled loop), its step and GloVe's AdaGrad step (against autograd), GloVe's compiled loop
(against a line-by-line rendering of glove.c's), its co-occurrence weights (by hand), planted
structure recovered by every method and with two workers, streaming, saved vectors reloading
in a new process, bad input refused before any work."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_close_rounding

from lmlab.cli import main
from lmlab.utils.errors import LmlabError
from lmlab.vectors import compiled, cooccurrence, glove, sentences, word2vec
from lmlab.vectors.keyed import load_vectors

gensim_models = pytest.importorskip("gensim.models")


def _zipf_corpus(words: int = 300, sentences_: int = 400, seed: int = 0) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    probabilities = 1.0 / np.arange(1, words + 1)
    probabilities /= probabilities.sum()
    return [[f"w{i}" for i in rng.choice(words, size=rng.integers(3, 15), p=probabilities)]
            for _ in range(sentences_)]


def _cluster_corpus(seed: int = 0) -> list[list[str]]:
    """Two clusters of 8 words; a sentence draws all its words from one cluster."""
    rng = np.random.default_rng(seed)
    clusters = [[f"a{i}" for i in range(8)], [f"b{i}" for i in range(8)]]
    return [[clusters[c][i] for i in rng.integers(0, 8, size=8)]
            for c in rng.integers(0, 2, size=1200)]


def _cluster_gap(vectors) -> tuple[float, float]:
    unit = vectors.unit_rows()
    cos = unit @ unit.T
    side = np.array([w[0] for w in vectors.words])
    same = side[:, None] == side[None, :]
    off_diagonal = ~np.eye(len(side), dtype=bool)
    return float(cos[same & off_diagonal].mean()), float(cos[~same].mean())


# -- vocabulary, subsampling, noise ---------------------------------------------------------------
def test_subsampling_and_noise_table_match_gensims():
    corpus = _zipf_corpus()
    model = gensim_models.Word2Vec(vector_size=8, min_count=3, sample=1e-3, negative=5,
                                   workers=1)
    model.build_vocab(corpus)
    vocabulary = sentences.count_words(corpus, min_count=3)
    # same words and counts (gensim orders ties differently: compare in its order)
    assert sorted(vocabulary.words) == sorted(model.wv.index_to_key)
    ours = dict(zip(vocabulary.words, vocabulary.counts.tolist()))
    words = model.wv.index_to_key
    counts = np.array([model.wv.get_vecattr(w, "count") for w in words])
    assert counts.tolist() == [ours[w] for w in words]
    assert np.all(np.diff(vocabulary.counts) <= 0)
    keep = word2vec.keep_probabilities(counts, 1e-3)
    theirs = np.array([model.wv.get_vecattr(w, "sample_int") for w in words], dtype=np.int64)
    # tol: the same formula with its operations in another order, truncated to an integer
    np.testing.assert_allclose(word2vec.sample_integers(counts, 1e-3), theirs, rtol=0, atol=1)
    assert keep[0] < 0.2 and keep[-1] == 1.0  # frequent words dropped, rare ones kept
    assert len(word2vec.sample_integers(counts, 0)) == 0  # no subsampling: no draws (gensim's)
    # tol: a float64 cumulative sum in another order, then rounded to an integer
    np.testing.assert_allclose(word2vec.noise_table(counts, 0.75), model.cum_table, rtol=0,
                               atol=1)


def test_subsampling_and_noise_follow_the_formulas():
    counts = np.array([1000, 100, 10, 1])
    threshold = 1e-2 * counts.sum()  # 11.11
    keep = word2vec.keep_probabilities(counts, 1e-2)
    assert keep[0] == pytest.approx((np.sqrt(1000 / threshold) + 1) * threshold / 1000)
    assert keep[2:].tolist() == [1.0, 1.0]
    assert word2vec.keep_probabilities(counts, 0).tolist() == [1.0] * 4
    # noise draws through the guide table: gensim's bisection of its table, faster
    table = word2vec.noise_table(counts, 0.75)
    guide, shift = compiled.noise_guide(table)
    states = np.random.default_rng(0).integers(0, 2**48, 200_000, dtype=np.uint64)
    draws = np.array([compiled._draw(table, guide, shift, state) for state in states])
    np.testing.assert_array_equal(draws, np.searchsorted(
        table, (states >> np.uint64(16)) % np.uint64(table[-1]), side="left"))
    weights = counts ** 0.75 / (counts ** 0.75).sum()
    frequency = np.bincount(draws, minlength=4) / len(draws)
    sigma = np.sqrt(weights * (1 - weights) / len(draws))
    assert np.all(np.abs(frequency - weights) < 5 * sigma)


# -- the updates against autograd ----------------------------------------------------------------
@pytest.mark.numerics
def test_word2vec_step_is_sgd_on_the_negative_sampling_loss():
    """One skip-gram example of the compiled loop (with a sigmoid table fine enough to stand for
    the function) steps both tables by autograd's gradient of the negative-sampling loss."""
    rng = np.random.default_rng(0)
    syn0 = (rng.standard_normal((12, 6)) * 0.3).astype(np.float32)
    syn1 = (rng.standard_normal((12, 6)) * 0.3).astype(np.float32)
    table = word2vec.noise_table(np.ones(12, np.int64))  # uniform noise over the 12 rows
    guide, shift = compiled.noise_guide(table)
    sigmoid, log_sigmoid, scale = compiled.sigmoid_tables(2**22)

    def draws(state: np.uint64) -> list[int]:  # the noise words the loop draws from ``state``
        rows = []
        for _ in range(3):
            rows.append(int(compiled._draw(table, guide, shift, state)))
            state = compiled._next(state)
        return rows

    seeds = np.random.default_rng(1).integers(0, 2**48, 100, dtype=np.uint64)
    state = next(s for s in seeds if len({0, 1, *draws(s)}) == 5)
    noise = draws(state)
    h = torch.tensor(syn0[1], requires_grad=True)  # input word 1 predicts word 0
    outputs = torch.tensor(syn1, requires_grad=True)
    scores = outputs[[0, *noise]] @ h
    loss = -(torch.nn.functional.logsigmoid(scores[0])
             + torch.nn.functional.logsigmoid(-scores[1:]).sum())
    loss.backward()
    before0, before1 = syn0.copy(), syn1.copy()
    reported, examples, _ = compiled.word2vec_chunk(
        syn0, syn1, np.array([1, 0]), np.zeros(2, np.int64), np.empty(0, np.uint32), table,
        guide, shift, np.array([0, 1]), False, 3, 0.1, 0.1, state, sigmoid, log_sigmoid, scale)
    assert examples == 1  # word 1's reach is 0; word 0's is 1: word 1 is its context
    # float32: dot products of 6, a table step of 3e-6 in the sigmoid, sums of 4 terms
    assert_close_rounding(reported, loss.item(), terms=24, depth=2, scale=1.0)
    scale_ = 0.1 * float(np.abs(np.concatenate([before0, before1])).max())
    assert_close_rounding(syn0[1] - before0[1], -0.1 * h.grad, terms=24, depth=2, scale=scale_)
    assert_close_rounding(syn1 - before1, -0.1 * outputs.grad, terms=24, depth=2,
                          scale=float(np.abs(before1).max()))
    assert np.array_equal(syn0[0], before0[0])  # the centre's own row is not an input here


# -- whole training passes against gensim's compiled loop ---------------------------------------
def _gensim_draws(model, state, effective_words: int, draws: int, shrink: bool):
    """What gensim's ``train_batch_sg/cbow`` draws from ``model.random`` in state ``state``
    (no subsampling): each centre's window reach, its noise words (``bisect_left(cum_table,
    (next_random >> 16) % cum_table[-1])``, the LCG stepped after each draw) and the seed of
    its 48-bit LCG."""
    replay = np.random.RandomState()
    replay.set_state(state)
    next_random = seed = (2**24) * replay.randint(0, 2**24) + replay.randint(0, 2**24)
    reduced = (replay.randint(0, model.window, effective_words) if shrink
               else np.zeros(effective_words, np.int64))
    cum_table = model.cum_table.astype(np.int64)
    noise = []
    for _ in range(draws):
        noise.append(int(np.searchsorted(cum_table, (next_random >> 16) % int(cum_table[-1]),
                                         side="left")))
        next_random = (next_random * 25214903917 + 11) & (2**48 - 1)
    return model.window - reduced, np.array(noise), seed


_EXP_TABLE = np.exp((np.arange(1000) / 1000 * 2 - 1) * 6)  # gensim's EXP_TABLE, before 1/(1+e)
_EXP_TABLE = (_EXP_TABLE / (_EXP_TABLE + 1)).astype(np.float32)


def _gensim_table_sigmoid(x: float) -> float:
    """gensim's sigmoid: its 1000-entry table over [-6, 6), read at ``int((x + 6) * 83)`` (its
    ``EXP_TABLE_SIZE / MAX_EXP / 2`` divides integers), so a logit near 0 reads 0.02-0.04 low.
    gensim skips the update when ``|x| >= 6``; these small tables never get there."""
    assert -6 < x < 6
    return float(_EXP_TABLE[int((float(x) + 6) * 83)])


def _gensim_loop(architecture, sentence_ids, reach, noise, syn0, syn1, alpha, sigmoid):
    """gensim's ``train_batch_sg`` / ``train_batch_cbow`` (negative sampling, ``cbow_mean=1``)
    one example at a time, as ``word2vec_inner.pyx`` writes them: CBOW's hidden vector is the
    mean of the context rows; the target and each noise word (skipped when equal to the
    target) step the output rows one after another, the input step ``work`` summing ``g`` times
    each output row before its update; ``work`` is added whole to every context row."""

    def negative_sampling(hidden, target, draws):
        work = np.zeros_like(hidden)
        for d, row in enumerate([target, *draws]):
            if d and row == target:
                continue
            g = (float(d == 0) - sigmoid(hidden @ syn1[row])) * alpha
            work += g * syn1[row]
            syn1[row] += g * hidden
        return work

    example, word = 0, 0
    k = noise.shape[1]
    for ids in sentence_ids:
        for i in range(len(ids)):
            b = reach[word]
            word += 1
            context = [ids[m] for m in range(max(0, i - b), min(len(ids), i + b + 1)) if m != i]
            if architecture == "cbow":
                work = negative_sampling(syn0[context].mean(0), ids[i], noise[example])
                example += 1
                for row in context:
                    syn0[row] += work
            else:
                for row in context:
                    work = negative_sampling(syn0[row].copy(), ids[i], noise[example])
                    example += 1
                    syn0[row] += work
    assert example * k <= noise.size  # draws enough for the examples made
    return syn0, syn1


@pytest.mark.numerics
@pytest.mark.parametrize("architecture,window", [("cbow", 3), ("skipgram", 2)])
def test_word2vec_is_gensims_algorithm_with_gensims_init(architecture, window):
    """One pass over a few sentences, lmlab's compiled loop against gensim's (``word2vec_inner``)
    from the same tables, random state and windows: fed gensim's sigmoid table (a coarse one,
    read at ``int((x + 6) * 83)``) it gives gensim's tables to float32 rounding; with its own
    table (read at each bin's centre) it gives ``_gensim_loop``, the line-by-line rendering of
    gensim's loop, reading that table. The input vectors start as gensim 4's do, the same
    numbers for the same seed: the C tool's half-as-wide init cost CBOW half a point of
    analogy accuracy against gensim (docs/vectors.md). Last, ``train_word2vec`` runs that loop
    with its own draws: the pass equals the loop called with them."""
    from gensim.models import word2vec_inner

    corpus = [["a", "b", "c", "a", "d", "e"], ["b", "e", "a", "c"],
              ["d", "a", "b", "f", "e", "c", "a"], ["f", "c"]]
    dim, negative, alpha, seed = 8, 3, 0.05, 7
    model = gensim_models.Word2Vec(vector_size=dim, window=window, negative=negative,
                                   min_count=1, sample=0, sg=int(architecture == "skipgram"),
                                   seed=seed, workers=1)
    model.build_vocab(corpus)
    words = list(model.wv.index_to_key)
    start = model.wv.vectors.copy()
    np.testing.assert_array_equal(word2vec.initial_inputs(len(words), dim, seed), start)

    state = model.random.get_state()
    work, hidden = model._get_thread_working_mem()
    if architecture == "cbow":
        word2vec_inner.train_batch_cbow(model, corpus, alpha, work, hidden, False)
    else:
        word2vec_inner.train_batch_sg(model, corpus, alpha, work, False)
    sentence_ids = [[words.index(w) for w in s] for s in corpus]
    ids = np.array([i for s in sentence_ids for i in s])
    sentence_of = np.repeat(np.arange(len(corpus)), [len(s) for s in corpus])
    examples = (len(ids) if architecture == "cbow"
                else sum(min(i, window) + min(len(s) - 1 - i, window)  # upper bound
                         for s in sentence_ids for i in range(len(s))))
    reach, noise, next_random = _gensim_draws(model, state, len(ids), examples * negative,
                                              shrink=True)
    atol = 64 * 2**-24 * np.abs(model.wv.vectors).max()  # float32 rounding of the largest row
    guide, shift = compiled.noise_guide(model.cum_table)

    def lmlab_pass(sigmoid, log_sigmoid, scale):
        syn0, syn1 = start.copy(), np.zeros_like(start)
        compiled.word2vec_chunk(syn0, syn1, ids, sentence_of, np.empty(0, np.uint32),
                                model.cum_table, guide, shift, reach, architecture == "cbow",
                                negative, alpha, alpha, np.uint64(next_random), sigmoid,
                                log_sigmoid, scale)
        return syn0, syn1

    syn0, syn1 = lmlab_pass(_EXP_TABLE, np.log(_EXP_TABLE), 83.0)  # gensim's table: its pass
    assert np.abs(syn0 - start).max() > 1000 * atol  # the pass moved the vectors
    np.testing.assert_allclose(syn0, model.wv.vectors, rtol=0, atol=atol)
    np.testing.assert_allclose(syn1, model.syn1neg, rtol=0, atol=atol)

    # the rendering reproduces gensim's pass with gensim's table, and lmlab's with lmlab's
    noise = noise.reshape(-1, negative)
    reference = _gensim_loop(architecture, sentence_ids, reach, noise, start.copy(),
                             np.zeros_like(start), alpha, _gensim_table_sigmoid)
    np.testing.assert_allclose(reference[0], model.wv.vectors, rtol=0, atol=atol)
    np.testing.assert_allclose(reference[1], model.syn1neg, rtol=0, atol=atol)
    sigmoid, log_sigmoid, scale = compiled.sigmoid_tables()
    reference = _gensim_loop(architecture, sentence_ids, reach, noise, start.copy(),
                             np.zeros_like(start), alpha,
                             lambda x: float(sigmoid[int((x + 6) * scale)]))
    syn0, syn1 = lmlab_pass(sigmoid, log_sigmoid, scale)
    np.testing.assert_allclose(syn0, reference[0], rtol=0, atol=atol)
    np.testing.assert_allclose(syn1, reference[1], rtol=0, atol=atol)

    # train_word2vec: its init, its random stream's windows and seed, one job, the same loop
    config = word2vec.Word2VecConfig(architecture=architecture, dim=dim, window=window,
                                     negative=negative, min_count=1, sample=0, alpha=alpha,
                                     min_alpha=alpha, epochs=1, seed=seed)
    vocabulary = sentences.Vocabulary(words, np.array([model.wv.get_vecattr(w, "count")
                                                       for w in words]))
    vectors, _ = word2vec.train_word2vec(corpus, config, show_progress=False,
                                         vocabulary=vocabulary)
    rng = np.random.default_rng((1, seed))
    reach = rng.integers(1, window + 1, len(ids))
    syn0, syn1 = start.copy(), np.zeros_like(start)
    compiled.word2vec_chunk(syn0, syn1, ids, sentence_of, np.empty(0, np.uint32),
                            word2vec.noise_table(vocabulary.counts), guide, shift, reach,
                            architecture == "cbow", negative, alpha, alpha,
                            np.uint64(rng.integers(2**48)), sigmoid, log_sigmoid, scale)
    np.testing.assert_array_equal(vectors.matrix, syn0)  # the same computation op for op


def _glove_c_loop(model, rows, cols, x, x_max, alpha, eta, clip):
    """``glove.c``'s ``glove_thread`` one entry at a time, as it writes it: the weighted
    residual, the squared error halved, gradients clipped, each AdaGrad step divided by the
    root of the sum before the sum grows, then the biases. Returns the cost and how many
    gradient entries of the words were clipped."""
    W, C, bw, bc = model.words, model.contexts, model.word_bias, model.context_bias
    gW, gC, gbw, gbc = model.sums[0], model.sums[1], model.bias_sums[0], model.bias_sums[1]
    cost, clipped = 0.0, 0
    for l1, l2, val in zip(rows, cols, x):
        diff = W[l1] @ C[l2] + bw[l1] + bc[l2] - np.log(val)
        fdiff = diff if val > x_max else (val / x_max) ** alpha * diff
        cost += 0.5 * fdiff * diff
        fdiff *= eta
        clipped += int((np.abs(fdiff * C[l2]) > clip).sum())
        temp1 = np.clip(fdiff * C[l2], -clip, clip)
        temp2 = np.clip(fdiff * W[l1], -clip, clip)
        W[l1] -= temp1 / np.sqrt(gW[l1])
        C[l2] -= temp2 / np.sqrt(gC[l2])
        gW[l1] += temp1 * temp1
        gC[l2] += temp2 * temp2
        bw[l1] -= fdiff / np.sqrt(gbw[l1])
        bc[l2] -= fdiff / np.sqrt(gbc[l2])
        gbw[l1] += fdiff * fdiff
        gbc[l2] += fdiff * fdiff
    return cost, clipped


@pytest.mark.numerics
def test_glove_loop_is_glove_c_line_by_line():
    """The compiled loop over shuffled entries that share rows (and a clipped gradient) gives
    the tables and loss of ``glove.c``'s loop rendered line by line, to float64 rounding."""
    rng = np.random.default_rng(0)
    rows, cols = rng.integers(0, 6, 40), rng.integers(0, 6, 40)
    x = rng.uniform(0.5, 30.0, 40)
    config = glove.GloveConfig(dim=5, learning_rate=0.3, grad_clip=0.05)
    ours, reference = glove.GloveModel(6, 5, seed=1), glove.GloveModel(6, 5, seed=1)
    ours.words *= 200  # large rows: some gradient entries reach the clip
    reference.words *= 200
    order = rng.permutation(40)
    loss = ours.train(rows, cols, np.log(x), glove.weighting(x, 10.0, 0.75), order, 0, 40,
                      config)
    expected, clipped = _glove_c_loop(reference, rows[order], cols[order], x[order], 10.0, 0.75, 0.3,
                             0.05)
    assert 0 < clipped < 40 * 5  # the clip was exercised, not everywhere
    for name in glove.GloveModel.NAMES:
        assert_close_rounding(getattr(ours, name), getattr(reference, name), terms=10, depth=40,
                              dtype=torch.float64)  # 40 sequential updates of dot products of 5
    assert_close_rounding(loss, expected, terms=40, depth=2, dtype=torch.float64)


@pytest.mark.numerics
def test_glove_step_is_adagrad_on_the_weighted_least_squares():
    model = glove.GloveModel(10, 4, seed=0)
    i, j = np.array([0, 1, 2]), np.array([3, 4, 5])  # all rows distinct
    x = np.array([1.0, 30.0, 4.0])
    log_x, weight = np.log(x), glove.weighting(x, 10.0, 0.75)
    params = [model.words, model.contexts, model.word_bias, model.context_bias]
    copies = [torch.tensor(p, requires_grad=True) for p in params]
    dots = (copies[0][i] * copies[1][j]).sum(1) + copies[2][i] + copies[3][j] - torch.tensor(log_x)
    loss = 0.5 * (torch.tensor(weight) * dots**2).sum()
    loss.backward()
    before = [p.copy() for p in params]
    reported = model.train(i, j, log_x, weight, np.arange(3), 0, 3, glove.GloveConfig())
    # float64: dot products of 4 plus two biases, a weighted sum of 3 squares
    assert_close_rounding(reported, loss.item(), terms=6, depth=2, dtype=torch.float64)
    for param, old, copy in zip(params, before, copies):
        # first step: the squared sums are 1, so the step is -lr * gradient (param - old
        # rounds at the size of the parameter)
        assert_close_rounding(param - old, -0.05 * copy.grad, terms=6, depth=2,
                              scale=float(np.abs(old).max() + 0.05 * copy.grad.abs().max()))
    # the sums grew by the squared (lr-scaled) gradients: the next step is smaller
    assert_close_rounding(model.sums[0][i], 1 + (0.05 * copies[0].grad[i]) ** 2, terms=6,
                          depth=2)


@pytest.mark.numerics
def test_glove_weighting_and_cooccurrences_by_hand():
    assert_close_rounding(glove.weighting(np.array([5.0, 10.0, 50.0]), 10.0, 0.75),
                          [0.5**0.75, 1.0, 1.0], dtype=torch.float64)  # one power in float64
    index = {"a": 0, "b": 1, "c": 2, "d": 3}
    # "a b c a d", window 2: distance 1 pairs ab bc ca ad; distance 2 pairs ac ba cd;
    # "x" is out of vocabulary and dropped before the window (so "d" and "a" are adjacent)
    counts = cooccurrence.count_cooccurrences([["a", "b", "c", "a", "x", "d"], ["d", "d"]],
                                              index, window=2)
    expected = np.array([[0, 1.5, 1.5, 1.0],
                         [1.5, 0, 1.0, 0],
                         [1.5, 1.0, 0, 0.5],
                         [1.0, 0, 0.5, 2.0]])  # "d d": both directions of one pair, 1 + 1
    np.testing.assert_array_equal(counts.dense(), expected)  # sums of 1 and 1/2: exact
    # tiny merge buffers give the same counts
    again = cooccurrence.count_cooccurrences([["a", "b", "c", "a", "x", "d"], ["d", "d"]],
                                             index, window=2, buffer_pairs=1, chunk_words=1)
    np.testing.assert_array_equal(again.dense(), expected)
    i, j, x = counts.entries()
    assert len(x) == np.count_nonzero(expected)
    np.testing.assert_array_equal(expected[i, j], x)


# -- training -------------------------------------------------------------------------------------
@pytest.mark.parametrize("architecture,workers", [("skipgram", 1), ("cbow", 1), ("cbow", 2)])
def test_word2vec_recovers_planted_clusters(architecture, workers):
    """Two workers (Hogwild threads on shared tables, jobs of 1,000 words) learn as one does."""
    config = word2vec.Word2VecConfig(architecture=architecture, dim=16, window=3, sample=0,
                                     min_count=1, epochs=3, seed=0, workers=workers,
                                     chunk_words=1000)
    vectors, summary = word2vec.train_word2vec(_cluster_corpus(), config, show_progress=False)
    within, across = _cluster_gap(vectors)
    assert within > 0.8 and within - across > 0.5, (within, across)
    assert summary.epoch_loss[-1] < summary.epoch_loss[0]
    assert summary.trained_words == 3 * 1200 * 8


@pytest.mark.parametrize("workers", [1, 2])
def test_glove_loss_decreases_and_recovers_planted_clusters(workers):
    config = glove.GloveConfig(dim=16, window=3, min_count=1, epochs=8, x_max=10, seed=0,
                               workers=workers, chunk_entries=16)
    vectors, summary = glove.train_glove(_cluster_corpus(), config, show_progress=False)
    assert all(b < a for a, b in zip(summary.epoch_loss, summary.epoch_loss[1:]))
    assert summary.entries == 2 * 8 * 8  # every ordered pair within a cluster, none across
    within, across = _cluster_gap(vectors)
    assert within > 0.8 and within - across > 0.5, (within, across)


def test_streaming_reads_the_source_once_per_pass(tmp_path):
    opened = []

    def stream():
        opened.append(1)
        yield from _cluster_corpus()

    config = word2vec.Word2VecConfig(dim=8, min_count=1, epochs=2, sample=0)
    word2vec.train_word2vec(sentences.Sentences(stream), config, show_progress=False)
    assert len(opened) == 1 + 2  # once to count, once per epoch
    opened.clear()
    glove.train_glove(sentences.Sentences(stream), glove.GloveConfig(dim=8, min_count=1,
                                                                     epochs=1),
                      show_progress=False)
    assert len(opened) == 2  # once to count, once for the co-occurrences
    with pytest.raises(LmlabError, match="one-shot iterator"):
        word2vec.train_word2vec(stream(), config, show_progress=False)
    text = tmp_path / "a.txt"
    text.write_text("The cat's hat, 2 cats!\n\nDon't stop\n")
    assert list(sentences.sentences_from(text)) == [["the", "cat's", "hat", "2", "cats"],
                                                    ["don't", "stop"]]


def test_glove_on_the_default_corpus_runs_as_the_docs_write_it(tmp_path, monkeypatch):
    """docs/vectors.md's commands that train GloVe on the default corpus and score it, run as
    written on a slice at toy size (flags appended: the last of a repeated flag wins)."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "vectors.md").read_text()
    block = page.split("### GloVe on the default corpus")[1].split("```bash\n")[1]
    lines = block.split("```")[0].strip().splitlines()
    toy = {"data": ["--sources", "kjv", "--max-documents", "40", "--exclude-tasks", "none",
                    "--validation-fraction", "0.1"],
           "train": ["--dim", "16", "--epochs", "2", "--min-count", "2"], "evaluate": []}
    monkeypatch.chdir(tmp_path)
    assert [shlex.split(line)[:2] for line in lines] == [["lmlab", "data"], ["lmlab", "vectors"],
                                                         ["lmlab", "vectors"]]
    for line in lines:
        args = shlex.split(line)[1:]
        assert main(args + toy[args[0] if args[0] == "data" else args[1]]) == 0
    scores = json.loads(Path("glove-default-scores.json").read_text())
    assert scores["dim"] == 16 and scores["words"] > 500
    assert scores["similarity"]["simlex999"]["pairs"] > 0
    assert scores["analogies"]["3cosadd"]["scored"] > 0


def _corpus_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(" ".join(s) for s in _cluster_corpus()) + "\n")
    return path


@pytest.mark.parametrize("method,out", [("skipgram", "v.bin"), ("glove", "v.txt")])
def test_cli_trains_and_the_vectors_reload_in_a_new_process(tmp_path, method, out):
    corpus = _corpus_file(tmp_path)
    assert main(["vectors", "train", "--method", method, "--corpus", str(corpus), "--out",
                 str(tmp_path / out), "--dim", "8", "--epochs", "2", "--min-count", "1"]) == 0
    ours = load_vectors(tmp_path / out)
    code = ("import sys; from lmlab.vectors.keyed import load_vectors; "
            "v = load_vectors(sys.argv[1]); print(len(v), v.dim, repr(float(v.matrix.sum())))")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / out)],
                          capture_output=True, text=True, check=True)
    assert done.stdout.split() == [str(len(ours)), "8", repr(float(ours.matrix.sum()))]
    assert len(ours) == 16


def test_bad_input_is_refused_before_any_work(tmp_path, capsys):
    corpus = _corpus_file(tmp_path)
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    existing = tmp_path / "exists.txt"
    existing.write_text("keep me")

    def refused(*args: str) -> str:
        assert main(["vectors", "train", *args]) == 2
        return capsys.readouterr().err

    assert "is empty" in refused("--corpus", str(empty), "--out", str(tmp_path / "o.txt"))
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("one two three\n")
    assert "only 0 word(s) occur at least 5 times" in refused(
        "--corpus", str(tiny), "--out", str(tmp_path / "o.txt"))
    assert "only 0 word(s) occur at least 1000 times" in refused(
        "--corpus", str(corpus), "--out", str(tmp_path / "o.txt"), "--min-count", "1000")
    assert "dim must be a whole number of at least 1" in refused(
        "--corpus", str(corpus), "--out", str(tmp_path / "o.txt"), "--dim", "0")
    assert "min_alpha" in refused("--corpus", str(corpus), "--out", str(tmp_path / "o.txt"),
                                  "--alpha", "0")
    assert "already exists" in refused("--corpus", str(corpus), "--out", str(existing))
    assert existing.read_text() == "keep me"
    assert "no text file" in refused("--corpus", str(tmp_path / "nope.txt"), "--out",
                                     str(tmp_path / "o.txt"))
    assert "not an lmlab corpus" in refused("--corpus", str(tmp_path), "--out",
                                            str(tmp_path / "o.txt"))
    assert "x_max must be positive" in refused("--method", "glove", "--corpus", str(corpus),
                                               "--out", str(tmp_path / "o.txt"), "--x-max", "0")
    assert not (tmp_path / "o.txt").exists()
    with pytest.raises(LmlabError, match="unknown word2vec architecture"):
        word2vec.train_word2vec([["a", "b"]], word2vec.Word2VecConfig(architecture="sg"))
    with pytest.raises(LmlabError, match="no two vocabulary words occur within a window"):
        glove.train_glove([["a"], ["b"]] * 5, glove.GloveConfig(min_count=1))
