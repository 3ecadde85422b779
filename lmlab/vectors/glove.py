"""GloVe: global vectors from weighted least squares on log co-occurrences (Pennington et al.
2014).

Fits word vectors ``w_i``, context vectors ``w~_j`` and biases to minimise, over the non-zero
co-occurrences ``X`` (:mod:`lmlab.vectors.cooccurrence`),
``J = sum_ij f(X_ij) (w_i . w~_j + b_i + b~_j - log X_ij)^2 / 2`` with
``f(x) = min(1, (x / x_max) ** alpha)``, by AdaGrad one entry at a time in the reference
``glove.c``'s compiled loop (:func:`lmlab.vectors.compiled.glove_entries`), on ``workers``
threads sharing the tables as its threads do, the entries shuffled each epoch; the vectors
are ``W + W~``. docs/vectors.md ("Training") gives the details and where each default comes
from.

Example:
    >>> vectors, summary = train_glove(corpus_sentences("corpus/"), GloveConfig(dim=100))
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from lmlab.training.loop_run import LoopModel
from lmlab.utils.checks import check_at_least, check_positive
from lmlab.utils.errors import LmlabError
from lmlab.vectors import compiled
from lmlab.vectors.cooccurrence import Cooccurrences, count_cooccurrences
from lmlab.vectors.keyed import WordVectors
from lmlab.vectors.loop import LoopSession, check_training_counts, training_vocabulary
from lmlab.vectors.sentences import Vocabulary


@dataclass
class GloveConfig:
    """What changes the vectors (see the module docstring for where each default comes from)."""

    METHOD: ClassVar[str] = "glove"  # a run folder's names (vectors.loop.loop_hparams)
    SCHEDULE: ClassVar[str] = "constant"  # AdaGrad at a constant rate

    dim: int = 100
    window: int = 10
    min_count: int = 5
    max_vocab: int | None = None
    x_max: float = 10.0
    alpha: float = 0.75
    learning_rate: float = 0.05
    grad_clip: float = 100.0  # glove.c's clip of each gradient entry
    epochs: int = 15
    seed: int = 1
    workers: int = 1  # threads sharing the tables (Hogwild); over 1, runs are not repeatable
    chunk_entries: int = 100_000  # entries per job (one worker's share of a round)
    buffer_pairs: int = 10_000_000  # co-occurrence pairs buffered before a merge

    def validate(self) -> None:
        """Refuse bad settings before any work."""
        check_training_counts(self, ("dim", "window", "min_count", "epochs", "chunk_entries",
                                     "buffer_pairs"))
        check_positive(self.x_max, "x_max")
        check_positive(self.learning_rate, "learning_rate")
        check_positive(self.grad_clip, "grad_clip")
        check_at_least(self.alpha, 0, "alpha")


def weighting(x: np.ndarray, x_max: float, alpha: float) -> np.ndarray:
    """GloVe's weight ``f(x) = min(1, (x / x_max) ** alpha)``: rare pairs count less, frequent
    pairs no more than ``x_max`` occurrences' worth."""
    return np.minimum(np.asarray(x, np.float64) / x_max, 1.0) ** alpha


class GloveModel:
    """Word and context vectors with their biases, and their AdaGrad sums (``glove.c``'s,
    float64 as its ``real``)."""

    NAMES = ("words", "contexts", "word_bias", "context_bias", "sums", "bias_sums")

    def __init__(self, size: int, dim: int, seed: int):
        rng = np.random.default_rng(seed)
        self.words, self.contexts = ((rng.random((size, dim)) - 0.5) / dim for _ in range(2))
        self.word_bias, self.context_bias = ((rng.random(size) - 0.5) / dim for _ in range(2))
        self.sums = np.ones((2, size, dim))  # the words' and the contexts'
        self.bias_sums = np.ones((2, size))

    def train(self, rows: np.ndarray, cols: np.ndarray, log_x: np.ndarray, weight: np.ndarray,
              order: np.ndarray, start: int, stop: int, config: GloveConfig) -> float:
        """AdaGrad on the entries ``order[start:stop]`` in turn (GIL released); returns their
        summed loss, each before its step."""
        return compiled.glove_entries(self.words, self.contexts, self.word_bias,
                                      self.context_bias, self.sums, self.bias_sums, rows, cols,
                                      log_x, weight, order, start, stop, config.learning_rate,
                                      config.grad_clip)

    def vectors(self) -> np.ndarray:
        """``W + W~`` as float32 (V, D)."""
        return (self.words + self.contexts).astype(np.float32)


@dataclass
class GloveSummary:
    """What a run did: vocabulary, non-zero co-occurrences, the mean loss per entry each epoch
    (the objective J over the number of entries), seconds counting and training; with a run
    folder, why it stopped and this session's cost report."""

    config: dict
    vocabulary: int
    corpus_words: int
    entries: int
    epoch_loss: list[float]
    count_seconds: float
    train_seconds: float
    stop_reason: str = "epochs"
    cost: dict | None = None


def train_glove(sentences: Iterable[list[str]], config: GloveConfig | None = None,
                show_progress: bool = True, vocabulary: Vocabulary | None = None,
                cooccurrences: Cooccurrences | None = None, run: Any = None
                ) -> tuple[WordVectors, GloveSummary]:
    """Count co-occurrences in ``sentences`` (re-iterable word lists; ``vocabulary`` and
    ``cooccurrences`` skip their passes when given), then fit GloVe. Returns ``W + W~`` and a
    summary. ``run`` (a :class:`~lmlab.training.loop_run.LoopRun`) checkpoints between rounds
    of jobs, resumes exactly and ends at its budget (the rate is constant)."""
    config = config or GloveConfig()
    config.validate()
    with ThreadPoolExecutor(config.workers, thread_name_prefix="glove") as pool:
        return _train(sentences, config, show_progress, vocabulary, cooccurrences, run, pool)


def _train(sentences, config, show_progress, vocabulary, cooccurrences, run, pool):
    started = time.perf_counter()
    vocabulary = training_vocabulary(sentences, config, vocabulary, run)
    if cooccurrences is None:
        cooccurrences = count_cooccurrences(sentences, vocabulary.index(), config.window,
                                            config.buffer_pairs)
    if len(cooccurrences) == 0:
        raise LmlabError("no two vocabulary words occur within a window of each other",
                         "give more text (sentences of several words), or a lower --min-count")
    count_seconds = time.perf_counter() - started
    rows, cols, x = cooccurrences.entries()
    log_x, weight = np.log(x), weighting(x, config.x_max, config.alpha)
    model = GloveModel(len(vocabulary.words), config.dim, config.seed)
    rng = np.random.default_rng((1, config.seed))
    # where the loop stands: epoch, next entry of its shuffled order, its summed loss so far,
    # the finished epochs' mean losses; the shuffle's generator as the epoch began
    at = {"epoch": 0, "start": 0, "total": 0.0, "losses": []}
    epoch_rng = rng.bit_generator.state
    session = LoopSession(run, show_progress)
    restored = session.resume()
    if restored is not None:
        at, tensors = restored
        epoch_rng = at.pop("rng")
        for name in GloveModel.NAMES:
            setattr(model, name, tensors[name].numpy())

    def snapshot():
        return ({**at, "rng": epoch_rng},
                {name: torch.from_numpy(getattr(model, name)) for name in GloveModel.NAMES})

    session.start(LoopModel("GloVe", 2 * len(vocabulary.words) * (config.dim + 1),
                            f"{6 * config.dim:,} FLOPs per co-occurrence entry: 3 x its dot "
                            "product", "co-occurrence entries (one per update)", "fp64"),
                  config.epochs * len(x), at["epoch"] * len(x) + at["start"], "glove", "pair")
    while session.stop is None and at["epoch"] < config.epochs:
        rng.bit_generator.state = epoch_rng
        order = rng.permutation(len(x))
        while session.stop is None and at["start"] < len(x):
            starts = range(at["start"], min(len(x), at["start"] + config.workers
                                             * config.chunk_entries), config.chunk_entries)
            stop = min(len(x), starts[-1] + config.chunk_entries)
            jobs = [pool.submit(model.train, rows, cols, log_x, weight, order, first,
                                min(first + config.chunk_entries, stop), config)
                    for first in starts]
            loss = sum(job.result() for job in jobs)
            entries = stop - at["start"]
            at.update(start=stop, total=at["total"] + loss)
            session.step(entries, 6 * config.dim * entries, snapshot)
        if session.stop is None:
            at.update(epoch=at["epoch"] + 1, start=0, total=0.0,
                      losses=at["losses"] + [at["total"] / len(x)])
            epoch_rng = rng.bit_generator.state
    train_seconds, cost = session.finish(snapshot)
    summary = GloveSummary(asdict(config), len(vocabulary.words), vocabulary.total, len(x),
                           at["losses"], count_seconds, train_seconds, session.stop or "epochs",
                           cost)
    return WordVectors(vocabulary.words, model.vectors()), summary

