"""GloVe: global vectors from weighted least squares on log co-occurrences (Pennington et al.
2014).

Fits word vectors ``w_i``, context vectors ``w~_j`` and biases to minimise, over the non-zero
co-occurrences ``X`` (:mod:`lmlab.vectors.cooccurrence`),
``J = sum_ij f(X_ij) (w_i . w~_j + b_i + b~_j - log X_ij)^2 / 2`` with
``f(x) = min(1, (x / x_max) ** alpha)``, by AdaGrad with the reference ``glove.c``'s rules, on
shuffled minibatches of entries; the vectors are ``W + W~``. docs/vectors.md ("Training")
gives the details and where each default comes from.

Example:
    >>> vectors, summary = train_glove(corpus_sentences("corpus/"), GloveConfig(dim=100))
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from lmlab.training.loop_run import LoopModel
from lmlab.utils.checks import check_at_least, check_positive
from lmlab.utils.errors import LmlabError
from lmlab.vectors.cooccurrence import Cooccurrences, count_cooccurrences
from lmlab.vectors.keyed import WordVectors
from lmlab.vectors.loop import (
    LoopSession,
    check_training_counts,
    threads_for_training,
    training_vocabulary,
)
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
    epochs: int = 15
    seed: int = 1
    threads: int = 1  # torch threads while training (see threads_for_training)
    batch_entries: int = 4096
    buffer_pairs: int = 10_000_000  # co-occurrence pairs buffered before a merge

    def validate(self) -> None:
        """Refuse bad settings before any work."""
        check_training_counts(self, ("dim", "window", "min_count", "epochs", "batch_entries",
                                     "buffer_pairs"))
        check_positive(self.x_max, "x_max")
        check_positive(self.learning_rate, "learning_rate")
        check_at_least(self.alpha, 0, "alpha")


def weighting(x: torch.Tensor, x_max: float, alpha: float) -> torch.Tensor:
    """GloVe's weight ``f(x) = min(1, (x / x_max) ** alpha)``: rare pairs count less, frequent
    pairs no more than ``x_max`` occurrences' worth."""
    return torch.clamp(x / x_max, max=1.0) ** alpha


class GloveModel:
    """Word and context vectors with their biases, and their AdaGrad sums (``glove.c``'s)."""

    def __init__(self, size: int, dim: int, seed: int):
        generator = torch.Generator().manual_seed(seed)

        def uniform(*shape: int) -> torch.Tensor:
            return (torch.rand(*shape, generator=generator, dtype=torch.float64) - 0.5) / dim

        self.words, self.contexts = uniform(size, dim), uniform(size, dim)
        self.word_bias, self.context_bias = uniform(size), uniform(size)
        self.sums = [torch.ones(size, dim, dtype=torch.float64),
                     torch.ones(size, dim, dtype=torch.float64),
                     torch.ones(size, dtype=torch.float64), torch.ones(size, dtype=torch.float64)]

    def step(self, i: torch.Tensor, j: torch.Tensor, log_x: torch.Tensor, weight: torch.Tensor,
             learning_rate: float) -> float:
        """One AdaGrad step on the entries (i, j); returns their loss before the step."""
        dots = (self.words[i] * self.contexts[j]).sum(dim=1)  # (B,)
        diff = dots + self.word_bias[i] + self.context_bias[j] - log_x  # (B,)
        loss = 0.5 * float((weight * diff * diff).sum())
        scaled = weight * diff * learning_rate  # glove.c's fdiff * eta
        grads = (scaled[:, None] * self.contexts[j], scaled[:, None] * self.words[i],
                 scaled, scaled)
        for param, total, rows, grad in zip(
                (self.words, self.contexts, self.word_bias, self.context_bias), self.sums,
                (i, j, i, j), grads):
            unique, slot = torch.unique(rows, return_inverse=True)
            summed = torch.zeros((len(unique), *grad.shape[1:]), dtype=grad.dtype)
            summed.index_add_(0, slot, grad)  # a row's gradients in this batch, summed
            param[unique] -= summed / torch.sqrt(total[unique])
            total[unique] += summed * summed
        return loss

    def vectors(self) -> np.ndarray:
        """``W + W~`` as float32 (V, D)."""
        return (self.words + self.contexts).to(torch.float32).numpy()


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
    summary. ``run`` (a :class:`~lmlab.training.loop_run.LoopRun`) checkpoints between
    minibatches, resumes exactly and ends at its budget (the rate is constant)."""
    config = config or GloveConfig()
    config.validate()
    with threads_for_training(config.threads):
        return _train(sentences, config, show_progress, vocabulary, cooccurrences, run)


def _train(sentences, config, show_progress, vocabulary, cooccurrences, run):
    started = time.perf_counter()
    vocabulary = training_vocabulary(sentences, config, vocabulary, run)
    if cooccurrences is None:
        cooccurrences = count_cooccurrences(sentences, vocabulary.index(), config.window,
                                            config.buffer_pairs)
    if len(cooccurrences) == 0:
        raise LmlabError("no two vocabulary words occur within a window of each other",
                         "give more text (sentences of several words), or a lower --min-count")
    count_seconds = time.perf_counter() - started
    i, j, x = (torch.from_numpy(a) for a in cooccurrences.entries())
    log_x, weight = torch.log(x), weighting(x, config.x_max, config.alpha)
    model = GloveModel(len(vocabulary.words), config.dim, config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    # where the loop stands: epoch, next entry of its shuffled order, its summed loss so far,
    # the finished epochs' mean losses; the shuffle's generator as the epoch began
    at = {"epoch": 0, "start": 0, "total": 0.0, "losses": []}
    epoch_rng = generator.get_state()
    session = LoopSession(run, show_progress)
    restored = session.resume()
    if restored is not None:
        at, tensors = restored
        model.words, model.contexts = tensors["words"], tensors["contexts"]
        model.word_bias, model.context_bias = tensors["word_bias"], tensors["context_bias"]
        model.sums = [tensors[f"sums.{k}"] for k in range(4)]
        epoch_rng = tensors["epoch_rng"]

    def snapshot():
        return at, {"words": model.words, "contexts": model.contexts,
                    "word_bias": model.word_bias, "context_bias": model.context_bias,
                    "epoch_rng": epoch_rng, **{f"sums.{k}": s for k, s in enumerate(model.sums)}}

    session.start(LoopModel("GloVe", 2 * len(vocabulary.words) * (config.dim + 1),
                            f"{6 * config.dim:,} FLOPs per co-occurrence entry: 3 x its dot "
                            "product", "co-occurrence entries (one per update)", "fp64"),
                  config.epochs * len(x), at["epoch"] * len(x) + at["start"], "glove", "pair")
    while session.stop is None and at["epoch"] < config.epochs:
        generator.set_state(epoch_rng)
        order = torch.randperm(len(x), generator=generator)
        while session.stop is None and at["start"] < len(x):
            batch = order[at["start"]:at["start"] + config.batch_entries]
            loss = model.step(i[batch], j[batch], log_x[batch], weight[batch],
                              config.learning_rate)
            at.update(start=at["start"] + len(batch), total=at["total"] + loss)
            session.step(len(batch), 6 * config.dim * len(batch), snapshot)
        if session.stop is None:
            at.update(epoch=at["epoch"] + 1, start=0, total=0.0,
                      losses=at["losses"] + [at["total"] / len(x)])
            epoch_rng = generator.get_state()
    train_seconds, cost = session.finish(snapshot)
    summary = GloveSummary(asdict(config), len(vocabulary.words), vocabulary.total, len(x),
                           at["losses"], count_seconds, train_seconds, session.stop or "epochs",
                           cost)
    return WordVectors(vocabulary.words, model.vectors()), summary
