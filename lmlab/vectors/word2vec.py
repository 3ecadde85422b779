"""word2vec: skip-gram and CBOW with negative sampling (Mikolov et al. 2013a, 2013b).

The C tool's recipe with gensim's defaults, so the two compare: a vocabulary of the words seen
``min_count`` times, subsampling of frequent words, a dynamic window that never crosses a
sentence, ``negative`` noise words from the unigram distribution to the 0.75, and SGD with a
learning rate decaying linearly from ``alpha`` to ``min_alpha``. A chunk's examples are made
with numpy and applied in minibatches of at most ``batch_pairs`` (see
:func:`examples_per_step`); docs/vectors.md ("Training", "Against gensim") gives every detail,
what was measured and why.

Example:
    >>> source = corpus_sentences("corpus/")   # lmlab.vectors.sentences
    >>> vectors, summary = train_word2vec(source, Word2VecConfig(dim=100))
    >>> vectors.most_similar("king", topn=5)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from lmlab.training.loop_run import LoopModel
from lmlab.utils.checks import check_at_least, check_choice
from lmlab.utils.errors import LmlabError
from lmlab.vectors.keyed import WordVectors
from lmlab.vectors.loop import (
    LoopSession,
    check_training_counts,
    refuse_one_shot,
    threads_for_training,
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


def draw_noise(cdf: np.ndarray, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Word indices drawn from the noise distribution ``cdf`` (:func:`noise_distribution`)."""
    return np.minimum(np.searchsorted(cdf, rng.random(shape), side="right"), len(cdf) - 1)


# -- training -------------------------------------------------------------------------------------
@dataclass
class Word2VecConfig:
    """What changes the vectors; the defaults are gensim's ``Word2Vec`` defaults (skip-gram
    instead of gensim's CBOW)."""

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
    threads: int = 1  # torch threads while training (see threads_for_training)
    batch_pairs: int = 512  # examples per SGD step, at most (see the module docstring)
    max_row_updates: float = 40.0  # a step's expected updates to its busiest row, at most
    chunk_words: int = 20_000  # words read, subsampled and paired at once

    def validate(self) -> None:
        """Refuse bad settings before any work."""
        check_choice(self.architecture, ARCHITECTURES, "architecture", "word2vec architecture")
        check_at_least(self.max_row_updates, 1, "max_row_updates")
        check_training_counts(self, ("dim", "window", "negative", "min_count", "epochs",
                                     "batch_pairs", "chunk_words"))
        if not 0 < self.min_alpha <= self.alpha:
            raise LmlabError(f"learning rates alpha={self.alpha}, min_alpha={self.min_alpha}",
                             "use 0 < min_alpha <= alpha (gensim: 0.0001 and 0.025)")
        if not 0 <= self.sample < 1:
            raise LmlabError(f"sample must be in [0, 1), not {self.sample}",
                             "use 0 to keep every word, 1e-3 (default) to drop frequent ones")
        check_at_least(self.ns_exponent, 0, "ns_exponent")


def examples_per_step(counts: np.ndarray, keep: np.ndarray, cdf: np.ndarray,
                      config: Word2VecConfig) -> int:
    """The minibatch size: ``batch_pairs``, lowered until the busiest row (the most frequent
    noise word, or input word: once per skip-gram example, about ``window + 1`` times per CBOW
    one) expects at most ``max_row_updates`` summed updates per step, which would otherwise
    overshoot on a handful of words (a toy corpus)."""
    kept = counts * keep
    input_share = float(kept.max() / kept.sum())
    noise_share = float(np.diff(cdf, prepend=0.0).max())
    inputs_per_example = 1 if config.architecture == "skipgram" else config.window + 1
    busiest = max(config.negative * noise_share, inputs_per_example * input_share)
    return max(1, min(config.batch_pairs, int(config.max_row_updates / busiest)))


def pair_positions(sentence_of: np.ndarray, window: int, rng: np.random.Generator
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(centre, context) positions of every pair within each centre's dynamic window
    ``b ~ U{1..window}``, never across a sentence (``sentence_of``: each position's sentence
    number), ordered by centre position as the sequential algorithm visits them."""
    n = len(sentence_of)
    reach = rng.integers(1, window + 1, size=n)  # (N,) b per centre
    positions = np.arange(n)
    centres, contexts = [], []
    for offset in range(1, window + 1):
        for sign in (-1, 1):
            shifted = positions + sign * offset
            near = ((shifted >= 0) & (shifted < n) & (reach >= offset)).nonzero()[0]
            near = near[sentence_of[shifted[near]] == sentence_of[near]]
            centres.append(near)
            contexts.append(shifted[near])
    centres, contexts = np.concatenate(centres), np.concatenate(contexts)
    order = np.argsort(centres, kind="stable")
    return centres[order], contexts[order]


class Word2VecTables:
    """The input (word) vectors and the output (context) vectors, and one SGD step."""

    def __init__(self, size: int, dim: int, seed: int):
        # gensim 4's init, the same numbers for the same seed: uniform in [-1, 1) / dim (the
        # C tool's, half as wide, cost CBOW half a point of analogies: docs/vectors.md)
        inputs = np.random.default_rng(seed).random((size, dim), dtype=np.float32)
        inputs *= 2.0
        inputs -= 1.0
        inputs /= dim
        self.inputs = torch.from_numpy(inputs)  # (V, D)
        self.outputs = torch.zeros(size, dim)

    def step(self, hidden: torch.Tensor, targets: torch.Tensor, negatives: torch.Tensor,
             lr: float) -> tuple[torch.Tensor, float]:
        """Negative sampling for B examples: ``hidden`` (B, D) predicts ``targets`` (B,) against
        ``negatives`` (B, k). Updates the output vectors in place; returns the step for
        ``hidden`` (B, D), computed with the output vectors before the update, and the loss."""
        rows = torch.cat([targets[:, None], negatives], dim=1)  # (B, 1 + k)
        vectors = self.outputs[rows]  # (B, 1 + k, D)
        scores = torch.bmm(vectors, hidden[:, :, None])[:, :, 0]  # (B, 1 + k)
        labels = torch.zeros_like(scores)
        labels[:, 0] = 1.0
        counted = torch.ones_like(scores)
        counted[:, 1:] = (negatives != targets[:, None]).float()  # the C tool skips these
        gradient = (labels - torch.sigmoid(scores)) * counted  # (B, 1 + k), -dloss/dscore
        signed = torch.where(labels > 0, scores, -scores)
        loss = -(torch.nn.functional.logsigmoid(signed) * counted).sum().item()
        gradient *= lr
        hidden_step = torch.bmm(gradient[:, None, :], vectors)[:, 0]  # (B, D)
        output_steps = gradient[:, :, None] * hidden[:, None, :]  # (B, 1 + k, D)
        self.outputs.index_add_(0, rows.reshape(-1), output_steps.reshape(-1, hidden.shape[1]))
        return hidden_step, loss


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
    examples_per_step: int
    stop_reason: str = "epochs"
    cost: dict | None = None


def train_word2vec(sentences: Iterable[list[str]], config: Word2VecConfig | None = None,
                   show_progress: bool = True, vocabulary: Vocabulary | None = None,
                   run: Any = None) -> tuple[WordVectors, Word2VecSummary]:
    """Train word2vec on ``sentences`` (word lists, re-iterable: read once to count unless a
    ``vocabulary`` is given, then once per epoch). Returns the input vectors, most frequent
    word first, and a summary. ``run`` (a :class:`~lmlab.training.loop_run.LoopRun`)
    checkpoints between chunks, resumes exactly and ends at its budget, the learning rate's
    decay fitted to the words the budget allows (docs/vectors.md, "Budget, resume and cost")."""
    config = config or Word2VecConfig()
    config.validate()
    refuse_one_shot(sentences)
    with threads_for_training(config.threads):
        return _train(sentences, config, show_progress, vocabulary, run)


def _train(sentences, config, show_progress, vocabulary, run):
    vocabulary = training_vocabulary(sentences, config, vocabulary, run)
    index = vocabulary.index()
    keep = keep_probabilities(vocabulary.counts, config.sample)
    cdf = noise_distribution(vocabulary.counts, config.ns_exponent)
    rng = np.random.default_rng((1, config.seed))  # a stream apart from the tables' init
    tables = Word2VecTables(len(vocabulary.words), config.dim, config.seed)
    batch = examples_per_step(vocabulary.counts, keep, cdf, config)
    planned = config.epochs * vocabulary.total
    # where the loop stands: epoch, sentences of it read, words read (all epochs, this epoch),
    # this epoch's summed loss and examples, the finished epochs' mean losses
    at = {"epoch": 0, "sentences": 0, "done": 0, "read": 0, "loss": 0.0, "examples": 0,
          "losses": []}
    session = LoopSession(run, show_progress)
    restored = session.resume()
    if restored is not None:
        at, tensors = restored
        rng.bit_generator.state = at.pop("rng")
        tables.inputs, tables.outputs = tensors["inputs"], tensors["outputs"]

    def snapshot():
        return ({**at, "rng": rng.bit_generator.state},
                {"inputs": tables.inputs, "outputs": tables.outputs})

    model = LoopModel(f"word2vec {config.architecture}", 2 * len(vocabulary.words) * config.dim,
                      f"{flops_per_example(config):,.0f} FLOPs per example: 3 x the "
                      f"{1 + config.negative} dot products of negative sampling",
                      "in-vocabulary words read")
    first_done = at["done"]
    session.start(model, planned, first_done, f"word2vec {config.architecture}", "word")
    while session.stop is None and at["epoch"] < config.epochs:
        for ids, sentence_of, read_sentences in word_chunks(sentences, index, config.chunk_words,
                                                            at["sentences"]):
            raw = len(ids)
            kept = rng.random(raw) < keep[ids]  # subsampling
            horizon = run.horizon(at["done"], planned) if run is not None else planned
            progress_from, progress_to = at["done"] / horizon, (at["done"] + raw) / horizon
            loss, count = _train_chunk(tables, ids[kept], sentence_of[kept], cdf, config, batch,
                                       rng, progress_from, progress_to)
            at.update(loss=at["loss"] + loss, examples=at["examples"] + count,
                      done=at["done"] + raw, read=at["read"] + raw, sentences=read_sentences)
            if session.step(raw, count * flops_per_example(config), snapshot) is not None:
                break
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
                              words / seconds if seconds > 0 else 0.0, batch,
                              session.stop or "epochs", cost)
    return WordVectors(vocabulary.words, tables.inputs.numpy()), summary


def flops_per_example(config: Word2VecConfig) -> float:
    """FLOPs of one example, counted as lmlab.cost counts a model's (matmuls only, 2 per
    multiply-add, training = 3 x forward): the forward is ``1 + negative`` dot products of
    ``dim`` (the context mean of CBOW is not a matmul)."""
    return 3 * 2 * config.dim * (1 + config.negative)


def _train_chunk(tables: Word2VecTables, ids: np.ndarray, sentence_of: np.ndarray,
                 cdf: np.ndarray, config: Word2VecConfig, batch: int,
                 rng: np.random.Generator, progress_from: float, progress_to: float
                 ) -> tuple[float, int]:
    """SGD over one chunk's examples in minibatches of ``batch`` examples, the learning rate
    decaying linearly with training progress; returns (summed loss, examples)."""
    if len(ids) < 2:
        return 0.0, 0
    centres, contexts = pair_positions(sentence_of, config.window, rng)
    if not len(centres):
        return 0.0, 0
    if config.architecture == "skipgram":
        inputs = torch.from_numpy(ids[contexts])  # (P,) each context word predicts its centre
        targets = torch.from_numpy(ids[centres])
        group = None
    else:  # CBOW: one example per centre, from the mean of its context words
        positions, slot = np.unique(centres, return_inverse=True)
        inputs = torch.from_numpy(ids[contexts])
        targets = torch.from_numpy(ids[positions])
        group = torch.from_numpy(slot)
        starts = np.searchsorted(slot, np.arange(len(positions) + 1))  # slot is sorted
    examples = len(targets)
    negatives = torch.from_numpy(draw_noise(cdf, (examples, config.negative), rng))
    loss_sum = 0.0
    span = progress_to - progress_from
    for start in range(0, examples, batch):
        stop = min(start + batch, examples)
        fraction = min(1.0, progress_from + span * (start / examples))  # 1: a budget's end
        lr = config.alpha - (config.alpha - config.min_alpha) * fraction
        if group is None:
            rows = inputs[start:stop]
            step, loss = tables.step(tables.inputs[rows], targets[start:stop],
                                     negatives[start:stop], lr)
            tables.inputs.index_add_(0, rows, step)
        else:
            first, last = int(starts[start]), int(starts[stop])
            rows = inputs[first:last]  # the context words of centres start..stop
            slots = group[first:last] - start
            sizes = torch.bincount(slots, minlength=stop - start).clamp(min=1)
            sums = torch.zeros(stop - start, config.dim).index_add_(0, slots, tables.inputs[rows])
            step, loss = tables.step(sums / sizes[:, None], targets[start:stop],
                                     negatives[start:stop], lr)
            tables.inputs.index_add_(0, rows, step[slots])  # each context word: the whole step
        loss_sum += loss
    return loss_sum, examples
