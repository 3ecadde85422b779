"""Training static word vectors: word2vec's subsampling and noise table (against the formulas
and gensim's own tables), its init and whole passes (against gensim's compiled loop), its SGD
step and GloVe's AdaGrad step (against autograd), GloVe's co-occurrence weights (by hand),
planted structure recovered by every method, streaming, saved vectors reloading in a new
process, bad input refused before any work."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import assert_close_rounding

from lmlab.cli import main
from lmlab.utils.errors import LmlabError
from lmlab.vectors import cooccurrence, glove, sentences, word2vec
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
    theirs = np.array([model.wv.get_vecattr(w, "sample_int") for w in words], dtype=np.float64)
    np.testing.assert_allclose(keep * (2**32 - 1), theirs, atol=1.0)  # tol: they truncate to uint32
    assert keep[0] < 0.2 and keep[-1] == 1.0  # frequent words dropped, rare ones kept
    cdf = word2vec.noise_distribution(counts, 0.75)
    np.testing.assert_allclose(cdf * (2**31 - 1), model.cum_table.astype(np.float64), atol=1.0)  # tol: gensim's integer table, truncated


def test_subsampling_and_noise_follow_the_formulas():
    counts = np.array([1000, 100, 10, 1])
    threshold = 1e-2 * counts.sum()  # 11.11
    keep = word2vec.keep_probabilities(counts, 1e-2)
    assert keep[0] == pytest.approx((np.sqrt(1000 / threshold) + 1) * threshold / 1000)
    assert keep[2:].tolist() == [1.0, 1.0]
    assert word2vec.keep_probabilities(counts, 0).tolist() == [1.0] * 4
    cdf = word2vec.noise_distribution(counts, 0.75)
    weights = counts ** 0.75 / (counts ** 0.75).sum()
    draws = word2vec.draw_noise(cdf, (200_000,), np.random.default_rng(0))
    frequency = np.bincount(draws, minlength=4) / len(draws)
    sigma = np.sqrt(weights * (1 - weights) / len(draws))
    assert np.all(np.abs(frequency - weights) < 5 * sigma)


def test_dynamic_window_pairs_stay_in_their_sentence():
    sentence_of = np.repeat(np.arange(50), 7)  # 50 sentences of 7 words
    centres, contexts = word2vec.pair_positions(sentence_of, 3, np.random.default_rng(0))
    distance = np.abs(centres - contexts)
    assert distance.min() >= 1 and distance.max() <= 3
    assert np.all(sentence_of[centres] == sentence_of[contexts])
    # each centre sees the same reach b on both sides: its pairs are the positions within b
    for centre in range(0, 350, 17):
        mine = contexts[centres == centre]
        reach = np.abs(mine - centre).max()
        inside = [p for p in range(centre - reach, centre + reach + 1)
                  if p != centre and 0 <= p < 350 and sentence_of[p] == sentence_of[centre]]
        assert sorted(mine.tolist()) == inside
    # the reach is uniform on 1..window: distance-d pairs are (window - d + 1) / window as many
    centres, contexts = word2vec.pair_positions(np.zeros(30_000, np.int64), 3,
                                                np.random.default_rng(0))  # one long sentence
    distance = np.abs(centres - contexts)
    shares = np.bincount(distance)[1:] / np.bincount(distance)[1]
    np.testing.assert_allclose(shares, [1, 2 / 3, 1 / 3], atol=0.02)  # tol: sampling, 90,000 pairs


def test_step_size_shrinks_only_for_a_handful_of_words():
    config = word2vec.Word2VecConfig(architecture="cbow", window=3, sample=0)
    counts = np.full(16, 100)  # 16 equally frequent words: each 1/16 of the inputs and noise
    keep = word2vec.keep_probabilities(counts, 0)
    cdf = word2vec.noise_distribution(counts)
    # the busiest row: a noise word (5 draws per example) before an input (4 per CBOW example)
    assert word2vec.examples_per_step(counts, keep, cdf, config) == int(40 / (5 / 16))
    config.window = 7  # now each CBOW example has up to 8 context words: inputs are busiest
    assert word2vec.examples_per_step(counts, keep, cdf, config) == int(40 / (8 / 16))
    zipf = (1e6 / np.arange(1, 25_001)).astype(np.int64)  # a real vocabulary's shape
    config = word2vec.Word2VecConfig(sample=1e-3)
    keep = word2vec.keep_probabilities(zipf, 1e-3)
    cdf = word2vec.noise_distribution(zipf)
    busiest_noise = 5 * cdf[0]  # the most frequent word is the busiest row: as a noise word
    assert word2vec.examples_per_step(zipf, keep, cdf, config) == int(40 / busiest_noise)
    assert 300 < int(40 / busiest_noise) <= 512  # hundreds of examples per step remain


# -- the updates against autograd ----------------------------------------------------------------
@pytest.mark.numerics
def test_word2vec_step_is_sgd_on_the_negative_sampling_loss():
    tables = word2vec.Word2VecTables(12, 6, seed=0)
    tables.outputs = torch.randn(12, 6, dtype=torch.float32) * 0.3
    hidden = torch.randn(4, 6) * 0.3
    targets = torch.tensor([0, 1, 2, 3])
    negatives = torch.tensor([[4, 5], [6, 7], [8, 9], [10, 11]])  # all rows distinct
    outputs = tables.outputs.clone().requires_grad_(True)
    h = hidden.clone().requires_grad_(True)
    rows = torch.cat([targets[:, None], negatives], 1)
    scores = torch.einsum("bd,bkd->bk", h, outputs[rows])
    loss = -(torch.nn.functional.logsigmoid(scores[:, 0]).sum()
             + torch.nn.functional.logsigmoid(-scores[:, 1:]).sum())
    loss.backward()
    before = tables.outputs.clone()
    step, reported = tables.step(hidden, targets, negatives, lr=0.1)
    # float32 both ways: dot products of 6, log-sigmoids, a sum over 4 x 3 pairs (each <= 1)
    assert_close_rounding(reported, loss.item(), terms=12, depth=2, scale=1.0)
    scale = 0.1 * float(torch.cat([hidden, before]).abs().max())  # lr x a vector's entries
    assert_close_rounding(step, -0.1 * h.grad, terms=6, depth=2, scale=scale)
    assert_close_rounding(tables.outputs - before, -0.1 * outputs.grad, terms=6, depth=2,
                          scale=float(before.abs().max()))  # a row moved by a step: its size
    # a noise word equal to the target is skipped (the C tool's rule): no step, no loss
    alone = -torch.nn.functional.logsigmoid(hidden[0] @ tables.outputs[0]).item()
    _, skipped = tables.step(hidden[:1], targets[:1], torch.tensor([[0, 0]]), lr=0.1)
    assert_close_rounding(skipped, alone, terms=6, scale=1.0)  # one dot product of 6


# -- whole training passes against gensim's compiled loop ---------------------------------------
def _gensim_draws(model, state, effective_words: int, draws: int, shrink: bool):
    """What gensim's ``train_batch_sg/cbow`` draws from ``model.random`` in state ``state``
    (no subsampling): its 48-bit LCG's seed, each centre's window reach, and its noise words
    (``bisect_left(cum_table, (next_random >> 16) % cum_table[-1])``, the LCG stepped after
    each draw)."""
    replay = np.random.RandomState()
    replay.set_state(state)
    next_random = (2**24) * replay.randint(0, 2**24) + replay.randint(0, 2**24)
    reduced = (replay.randint(0, model.window, effective_words) if shrink
               else np.zeros(effective_words, np.int64))
    cum_table = model.cum_table.astype(np.int64)
    noise = []
    for _ in range(draws):
        noise.append(int(np.searchsorted(cum_table, (next_random >> 16) % int(cum_table[-1]),
                                         side="left")))
        next_random = (next_random * 25214903917 + 11) & (2**48 - 1)
    return model.window - reduced, np.array(noise)


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
    assert example * k == noise.size
    return syn0, syn1


@pytest.mark.parametrize("architecture,window", [("cbow", 3), ("skipgram", 1)])
def test_word2vec_is_gensims_algorithm_with_gensims_init(monkeypatch, architecture, window):
    """One pass over a few sentences with one example per step, lmlab against gensim's
    compiled loop (``word2vec_inner``) from the same tables, windows and noise words. gensim's
    sigmoid is a coarse table, so the comparison goes through ``_gensim_loop``: with gensim's
    table it reproduces gensim's compiled pass to float32 rounding, and with the exact
    sigmoid it must give lmlab's tables. The input vectors start as gensim 4's do, the same
    numbers for the same seed: the C tool's half-as-wide init cost CBOW half a point of
    analogy accuracy against gensim (docs/vectors.md)."""
    from gensim.models import word2vec_inner

    corpus = [["a", "b", "c", "a", "d", "e"], ["b", "e", "a", "c"],
              ["d", "a", "b", "f", "e", "c", "a"], ["f", "c"]]
    dim, negative, alpha, seed = 8, 3, 0.05, 7
    model = gensim_models.Word2Vec(vector_size=dim, window=window, negative=negative,
                                   min_count=1, sample=0, sg=int(architecture == "skipgram"),
                                   shrink_windows=architecture == "cbow", seed=seed, workers=1)
    model.build_vocab(corpus)
    words = list(model.wv.index_to_key)
    start = model.wv.vectors.copy()
    # the init: gensim's numbers, not only its distribution
    tables = word2vec.Word2VecTables(len(words), dim, seed)
    np.testing.assert_array_equal(tables.inputs.numpy(), start)
    assert not tables.outputs.any()

    state = model.random.get_state()
    work, hidden = model._get_thread_working_mem()
    if architecture == "cbow":
        word2vec_inner.train_batch_cbow(model, corpus, alpha, work, hidden, False)
    else:
        word2vec_inner.train_batch_sg(model, corpus, alpha, work, False)
    sentence_ids = [[words.index(w) for w in s] for s in corpus]
    effective = sum(map(len, corpus))
    examples = (effective if architecture == "cbow"
                else sum(2 * len(s) - 2 for s in corpus))  # window 1: both neighbours
    reach, noise = _gensim_draws(model, state, effective, examples * negative,
                                 shrink=architecture == "cbow")
    noise = noise.reshape(examples, negative)

    # the reference reproduces gensim's compiled pass
    syn0, syn1 = _gensim_loop(architecture, sentence_ids, reach, noise, start.copy(),
                              np.zeros_like(start), alpha, _gensim_table_sigmoid)
    atol = 64 * 2**-24 * np.abs(model.wv.vectors).max()  # float32 rounding of the largest row
    np.testing.assert_allclose(syn0, model.wv.vectors, rtol=0, atol=atol)
    np.testing.assert_allclose(syn1, model.syn1neg, rtol=0, atol=atol)

    # lmlab, one example per step, fed gensim's window reach and noise words, gives the
    # reference with the exact sigmoid. The noise words here are distinct within an example
    # (the target among them at times): gensim steps a noise word drawn twice in one example
    # twice in turn, the second time from the updated row, while lmlab's step computes both from
    # the row as it was (a second-order difference, for the rare repeated draw of a real
    # vocabulary; with this one's 6 words most examples would have one)
    noise = np.stack([np.random.default_rng(row).choice(len(words), negative, replace=False)
                      for row in range(examples)])  # (examples, negative)
    targets = ([ids[i] for ids in sentence_ids for i in range(len(ids))]
               if architecture == "cbow" else
               [ids[i] for ids in sentence_ids for i in range(len(ids)) for _ in
                range((i > 0) + (i < len(ids) - 1))])
    assert (noise == np.array(targets)[:, None]).any(axis=1).sum() >= 3  # skips exercised
    made = []

    class Recorded(word2vec.Word2VecTables):
        def __init__(self, *args):
            super().__init__(*args)
            made.append(self)

    class GensimReach:
        def integers(self, low, high, size):
            assert (low, high, size) == (1, window + 1, effective)
            return reach

    pair_positions = word2vec.pair_positions
    monkeypatch.setattr(word2vec, "Word2VecTables", Recorded)
    monkeypatch.setattr(word2vec, "pair_positions",
                        lambda sentence_of, w, rng: pair_positions(sentence_of, w, GensimReach()))
    monkeypatch.setattr(word2vec, "draw_noise", lambda cdf, shape, rng: noise)
    config = word2vec.Word2VecConfig(architecture=architecture, dim=dim, window=window,
                                     negative=negative, min_count=1, sample=0, alpha=alpha,
                                     min_alpha=alpha, epochs=1, seed=seed, batch_pairs=1)
    vocabulary = sentences.Vocabulary(words, np.array([model.wv.get_vecattr(w, "count")
                                                       for w in words]))
    vectors, summary = word2vec.train_word2vec(corpus, config, show_progress=False,
                                               vocabulary=vocabulary)
    assert summary.examples_per_step == 1
    syn0, syn1 = _gensim_loop(architecture, sentence_ids, reach, noise, start.copy(),
                              np.zeros_like(start), alpha, lambda x: 1 / (1 + np.exp(-x)))
    assert np.abs(syn0 - start).max() > 1000 * atol  # the pass moved the vectors
    np.testing.assert_allclose(vectors.matrix, syn0, rtol=0, atol=atol)
    np.testing.assert_allclose(made[0].outputs.numpy(), syn1, rtol=0, atol=atol)


@pytest.mark.numerics
def test_glove_step_is_adagrad_on_the_weighted_least_squares():
    model = glove.GloveModel(10, 4, seed=0)
    i, j = torch.tensor([0, 1, 2]), torch.tensor([3, 4, 5])  # all rows distinct
    x = torch.tensor([1.0, 30.0, 4.0], dtype=torch.float64)
    log_x, weight = torch.log(x), glove.weighting(x, 10.0, 0.75)
    params = [model.words, model.contexts, model.word_bias, model.context_bias]
    copies = [p.clone().requires_grad_(True) for p in params]
    dots = (copies[0][i] * copies[1][j]).sum(1) + copies[2][i] + copies[3][j] - log_x
    loss = 0.5 * (weight * dots**2).sum()
    loss.backward()
    before = [p.clone() for p in params]
    reported = model.step(i, j, log_x, weight, learning_rate=0.05)
    # float64: dot products of 4 plus two biases, a weighted sum of 3 squares
    assert_close_rounding(reported, loss.item(), terms=6, depth=2, dtype=torch.float64)
    for param, old, copy in zip(params, before, copies):
        # first step: the squared sums are 1, so the step is -lr * gradient (param - old
        # rounds at the size of the parameter)
        assert_close_rounding(param - old, -0.05 * copy.grad, terms=6, depth=2,
                              scale=float(old.abs().max() + 0.05 * copy.grad.abs().max()))
    # the sums grew by the squared (lr-scaled) gradients: the next step is smaller
    assert_close_rounding(model.sums[0][i], 1 + (0.05 * copies[0].grad[i]) ** 2, terms=6,
                          depth=2)


@pytest.mark.numerics
def test_glove_weighting_and_cooccurrences_by_hand():
    assert_close_rounding(glove.weighting(torch.tensor([5.0, 10.0, 50.0], dtype=torch.float64), 10.0, 0.75),
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
@pytest.mark.parametrize("architecture", ["skipgram", "cbow"])
def test_word2vec_recovers_planted_clusters(architecture):
    config = word2vec.Word2VecConfig(architecture=architecture, dim=16, window=3, sample=0,
                                     min_count=1, epochs=3, seed=0)
    vectors, summary = word2vec.train_word2vec(_cluster_corpus(), config, show_progress=False)
    within, across = _cluster_gap(vectors)
    assert within > 0.8 and within - across > 0.5, (within, across)
    assert summary.epoch_loss[-1] < summary.epoch_loss[0]
    assert summary.trained_words == 3 * 1200 * 8


def test_glove_loss_decreases_and_recovers_planted_clusters():
    config = glove.GloveConfig(dim=16, window=3, min_count=1, epochs=8, x_max=10, seed=0,
                               batch_entries=64)
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
