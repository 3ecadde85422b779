"""word2vec: skip-gram and CBOW with negative sampling (Mikolov et al. 2013a, 2013b).

The C tool's recipe with gensim's defaults, so the two compare: a vocabulary of the words seen
``min_count`` times, subsampling of frequent words, a dynamic window that never crosses a
sentence, ``negative`` noise words from the unigram distribution to the 0.75, and SGD with a
learning rate decaying linearly from ``alpha`` to ``min_alpha``, one example at a time in
gensim's compiled loop (:func:`lmlab.vectors.compiled.word2vec_chunk`), on ``workers`` threads
sharing the tables as gensim's do. docs/vectors.md ("Training", "Against gensim") gives every
detail and how it was checked.

Example:
    >>> source = corpus_sentences("corpus/")   # lmlab.vectors.sentences
    >>> vectors, summary = train_word2vec(source, Word2VecConfig(dim=100))
    >>> vectors.most_similar("king", topn=5)
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from lmlab.training.loop_run import LoopModel
from lmlab.utils.checks import check_at_least, check_choice
from lmlab.utils.errors import LmlabError
from lmlab.vectors import compiled
from lmlab.vectors.keyed import WordVectors
from lmlab.vectors.loop import (
    LoopSession,
    check_training_counts,
    refuse_one_shot,
    training_vocabulary,
)
from lmlab.vectors.sentences import Vocabulary, word_chunks

ARCHITECTURES = ("skipgram", "cbow")


# -- subsampling and noise ------------------------------------------------------------------------
def keep_probabilities(counts: np.ndarray, sample: float) -> np.ndarray:
    """Subsampling (Mikolov et al. 2013b, gensim's form): the probability of keeping each
    occurrence of a word of count ``c``, ``min(1, (sqrt(c / t) + 1) * t / c)`` with
    ``t = sample * sum(counts)``; all ones when ``sample`` is 0."""
    counts = np.asarray(counts, dtype=np.float64)
    if sample <= 0:
        return np.ones_like(counts)
    threshold = sample * counts.sum()
    return np.minimum((np.sqrt(counts / threshold) + 1) * threshold / counts, 1.0)


def noise_distribution(counts: np.ndarray, exponent: float = 0.75) -> np.ndarray:
    """The cumulative noise distribution: ``counts ** exponent`` normalised, summed up (the
    last entry is 1). gensim's ``cum_table`` is this times ``2**31 - 1``, rounded."""
    weights = np.asarray(counts, dtype=np.float64) ** exponent
    cdf = np.cumsum(weights / weights.sum())
    cdf[-1] = 1.0
    return cdf


def sample_integers(counts: np.ndarray, sample: float) -> np.ndarray:
    """gensim's ``sample_int``: each word's keep probability times ``2**32 - 1`` as uint32 (a
    word stays when it is at least a random 32-bit draw); empty when ``sample`` is 0 (no draws,
    as in gensim)."""
    if sample <= 0:
        return np.empty(0, np.uint32)
    return (keep_probabilities(counts, sample) * (2**32 - 1)).astype(np.uint32)


def noise_table(counts: np.ndarray, exponent: float = 0.75) -> np.ndarray:
    """gensim's ``cum_table``: the noise distribution's cumulative sums times ``2**31 - 1``,
    rounded, as uint32 (a draw is the first entry at least a random number below the last)."""
    return np.round(noise_distribution(counts, exponent) * (2**31 - 1)).astype(np.uint32)


def initial_inputs(size: int, dim: int, seed: int) -> np.ndarray:
    """gensim 4's init, the same numbers for the same seed: uniform in ``[-1, 1) / dim`` (the C
    tool's, half as wide, cost CBOW half a point of analogies: docs/vectors.md); (V, D)."""
    inputs = np.random.default_rng(seed).random((size, dim), dtype=np.float32)
    inputs *= 2.0
    inputs -= 1.0
    inputs /= dim
    return inputs


# -- training -------------------------------------------------------------------------------------
@dataclass
class Word2VecConfig:
    """What changes the vectors; the defaults are gensim's ``Word2Vec`` defaults (skip-gram
    instead of gensim's CBOW, one worker instead of three: reproducible)."""

    METHOD: ClassVar[str] = "word2vec"  # a run folder's names (vectors.loop.loop_hparams)
    SCHEDULE: ClassVar[str] = "linear"  # the rate decays linearly over the run's horizon

    architecture: str = "skipgram"
    dim: int = 100
    window: int = 5
    negative: int = 5
    min_count: int = 5
    sample: float = 1e-3
    alpha: float = 0.025
    min_alpha: float = 1e-4
    epochs: int = 5
    ns_exponent: float = 0.75
    max_vocab: int | None = None
    seed: int = 1
    workers: int = 1  # threads sharing the tables (Hogwild); over 1, runs are not repeatable
    chunk_words: int = 10_000  # words per job (gensim's): read, then trained by one worker

    def validate(self) -> None:
        """Refuse bad settings before any work."""
        check_choice(self.architecture, ARCHITECTURES, "architecture", "word2vec architecture")
        check_training_counts(self, ("dim", "window", "negative", "min_count", "epochs",
                                     "chunk_words"))
        if not 0 < self.min_alpha <= self.alpha:
            raise LmlabError(f"learning rates alpha={self.alpha}, min_alpha={self.min_alpha}",
                             "use 0 < min_alpha <= alpha (gensim: 0.0001 and 0.025)")
        if not 0 <= self.sample < 1:
            raise LmlabError(f"sample must be in [0, 1), not {self.sample}",
                             "use 0 to keep every word, 1e-3 (default) to drop frequent ones")
        check_at_least(self.ns_exponent, 0, "ns_exponent")


@dataclass
class Word2VecSummary:
    """What a run did: vocabulary size, words read, mean loss per example per epoch, speed;
    with a run folder, why it stopped and this session's cost report."""

    config: dict
    vocabulary: int
    corpus_words: int  # in-vocabulary words of one pass
    trained_words: int  # in-vocabulary words read over all epochs (before subsampling)
    epoch_loss: list[float]
    seconds: float
    words_per_second: float
    stop_reason: str = "epochs"
    cost: dict | None = None


def train_word2vec(sentences: Iterable[list[str]], config: Word2VecConfig | None = None,
                   show_progress: bool = True, vocabulary: Vocabulary | None = None,
                   run: Any = None) -> tuple[WordVectors, Word2VecSummary]:
    """Train word2vec on ``sentences`` (word lists, re-iterable: read once to count unless a
    ``vocabulary`` is given, then once per epoch). Returns the input vectors, most frequent
    word first, and a summary. ``run`` (a :class:`~lmlab.training.loop_run.LoopRun`)
    checkpoints between rounds of jobs, resumes exactly and ends at its budget, the learning
    rate's decay fitted to the words the budget allows (docs/vectors.md, "Budget, resume and
    cost")."""
    config = config or Word2VecConfig()
    config.validate()
    refuse_one_shot(sentences)
    vocabulary = training_vocabulary(sentences, config, vocabulary, run)
    with ThreadPoolExecutor(config.workers, thread_name_prefix="word2vec") as pool:
        return _train(sentences, config, show_progress, vocabulary, run, pool)


class _Tables:
    """What the jobs share: the input and output vectors (V, D) and the sampling tables."""

    def __init__(self, vocabulary: Vocabulary, config: Word2VecConfig):
        self.inputs = initial_inputs(len(vocabulary.words), config.dim, config.seed)
        self.outputs = np.zeros_like(self.inputs)
        self.keep = sample_integers(vocabulary.counts, config.sample)
        self.noise = noise_table(vocabulary.counts, config.ns_exponent)
        self.guide, self.shift = compiled.noise_guide(self.noise)
        self.sigmoid, self.log_sigmoid, self.scale = compiled.sigmoid_tables()


def _train(sentences, config, show_progress, vocabulary, run, pool):
    index = vocabulary.index()
    rng = np.random.default_rng((1, config.seed))  # a stream apart from the tables' init
    tables = _Tables(vocabulary, config)
    planned = config.epochs * vocabulary.total
    # where the loop stands: epoch, sentences of it read, words read (all epochs, this epoch),
    # this epoch's summed loss and examples, the finished epochs' mean losses
    at = {"epoch": 0, "sentences": 0, "done": 0, "read": 0, "loss": 0.0, "examples": 0,
          "losses": []}
    session = LoopSession(run, show_progress)
    restored = session.resume()
    if restored is not None:
        at, saved = restored
        rng.bit_generator.state = at.pop("rng")
        tables.inputs, tables.outputs = saved["inputs"].numpy(), saved["outputs"].numpy()

    def snapshot():
        return ({**at, "rng": rng.bit_generator.state},
                {"inputs": torch.from_numpy(tables.inputs),
                 "outputs": torch.from_numpy(tables.outputs)})

    model = LoopModel(f"word2vec {config.architecture}", 2 * len(vocabulary.words) * config.dim,
                      f"{flops_per_example(config):,.0f} FLOPs per example: 3 x the "
                      f"{1 + config.negative} dot products of negative sampling",
                      "in-vocabulary words read")
    first_done = at["done"]
    session.start(model, planned, first_done, f"word2vec {config.architecture}", "word")
    while session.stop is None and at["epoch"] < config.epochs:
        rounds = _batches(word_chunks(sentences, index, config.chunk_words, at["sentences"]),
                          config.workers)  # a job per worker
        chunks = next(rounds, None)
        while chunks is not None:
            horizon = run.horizon(at["done"], planned) if run is not None else planned
            futures, done = [], at["done"]
            for ids, sentence_of, _ in chunks:  # each job: its own seed and share of the decay
                futures.append(pool.submit(
                    _train_chunk, tables, ids, sentence_of, config, done / horizon,
                    (done + len(ids)) / horizon, rng.integers(1, config.window + 1, len(ids)),
                    int(rng.integers(2**48))))
                done += len(ids)
            upcoming = next(rounds, None)  # read the next round while this one trains
            results = [future.result() for future in futures]
            raw = done - at["done"]
            count = sum(examples for _, examples in results)
            at.update(loss=at["loss"] + sum(loss for loss, _ in results),
                      examples=at["examples"] + count, done=done, read=at["read"] + raw,
                      sentences=chunks[-1][2])
            if session.step(raw, count * flops_per_example(config), snapshot) is not None:
                break
            chunks = upcoming
        if session.stop is not None:
            break
        if at["read"] == 0:
            raise LmlabError("the sentences were empty on a second reading",
                             "pass a re-iterable source (see Sentences), not a used-up one")
        at.update(epoch=at["epoch"] + 1, sentences=0, read=0, loss=0.0, examples=0,
                  losses=at["losses"] + [at["loss"] / max(at["examples"], 1)])
    seconds, cost = session.finish(snapshot)
    words = at["done"] - first_done
    summary = Word2VecSummary(asdict(config), len(vocabulary.words), vocabulary.total,
                              at["done"], at["losses"], seconds,
                              words / seconds if seconds > 0 else 0.0,
                              session.stop or "epochs", cost)
    return WordVectors(vocabulary.words, tables.inputs), summary


def _batches(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    items = iter(items)
    while batch := list(itertools.islice(items, size)):
        yield batch


def flops_per_example(config: Word2VecConfig) -> float:
    """FLOPs of one example, counted as lmlab.cost counts a model's (matmuls only, 2 per
    multiply-add, training = 3 x forward): the forward is ``1 + negative`` dot products of
    ``dim`` (the context mean of CBOW is not a matmul)."""
    return 3 * 2 * config.dim * (1 + config.negative)


def _train_chunk(tables: _Tables, ids: np.ndarray, sentence_of: np.ndarray,
                 config: Word2VecConfig, progress_from: float, progress_to: float,
                 reach: np.ndarray, seed: int) -> tuple[float, int]:
    """One job: a chunk of words trained in the compiled loop (GIL released), the learning
    rate decaying linearly with training progress (capped at ``min_alpha``: a budget's end),
    each kept word's window reach from ``reach``; returns (summed loss, examples)."""
    def rate(progress: float) -> float:
        return config.alpha - (config.alpha - config.min_alpha) * min(1.0, progress)

    loss, examples, _ = compiled.word2vec_chunk(
        tables.inputs, tables.outputs, ids, sentence_of, tables.keep, tables.noise, tables.guide,
        tables.shift, reach,
        config.architecture == "cbow", config.negative, rate(progress_from), rate(progress_to),
        np.uint64(seed), tables.sigmoid, tables.log_sigmoid, tables.scale)
    return loss, examples
