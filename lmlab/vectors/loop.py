"""What the word2vec and GloVe loops share around their compiled update loops: the settings
check, the vocabulary pass, and a session holding the optional run folder
(:class:`lmlab.training.loop_run.LoopRun`: resume, checkpoints, budget, cost) and the
progress bar; and torch's thread count for small steps (probing's)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict
from typing import Any

from lmlab.training.loop_run import LoopModel, LoopState
from lmlab.utils.checks import check_at_least
from lmlab.utils.errors import LmlabError
from lmlab.vectors.sentences import Vocabulary, count_words


def loop_hparams(config: Any) -> dict[str, Any]:
    """What a run folder records and compares on resume: every setting of ``config`` but
    ``workers`` (speed), with its ``METHOD`` and learning-rate ``SCHEDULE`` named."""
    return {**{k: v for k, v in asdict(config).items() if k != "workers"},
            "method": config.METHOD, "schedule": config.SCHEDULE}


def check_training_counts(config: Any, names: tuple[str, ...]) -> None:
    """Refuse, before any work, settings that word2vec and GloVe share: the whole numbers
    ``names`` of ``config`` and its ``workers`` must be at least 1, ``max_vocab`` (if set) at
    least 2."""
    for name in (*names, "workers"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise LmlabError(f"{name} must be a whole number of at least 1, not {value!r}",
                             f"give a positive {name}")
    check_at_least(config.max_vocab, 2, "max_vocab")


@contextlib.contextmanager
def threads_for_training(threads: int) -> Iterator[None]:
    """Run torch on ``threads`` intra-op threads inside the block, then restore the setting
    (for loops of steps too small to share between threads)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def refuse_one_shot(sentences: Iterable[list[str]]) -> None:
    """Refuse a generator: training reads the sentences more than once."""
    if iter(sentences) is sentences:
        raise LmlabError("the sentences are a one-shot iterator (a generator), read once",
                         "pass a list, a Sentences stream (corpus_sentences, text_sentences), or "
                         "Sentences(generator_function) so each pass reads them again")


def training_vocabulary(sentences: Iterable[list[str]], config: Any,
                        vocabulary: Vocabulary | None, run: Any) -> Vocabulary:
    """``vocabulary``, or the words of ``sentences`` counted in one pass (with the corpus's
    fingerprint when ``run`` keeps checkpoints), checked against a resumed run's corpus."""
    if vocabulary is None:
        refuse_one_shot(sentences)
        vocabulary = count_words(sentences, config.min_count, config.max_vocab,
                                 fingerprint=run is not None and run.keeps_checkpoints)
    if run is not None:
        run.check_data(vocabulary.fingerprint)
    return vocabulary


class LoopSession:
    """A loop's session: its run folder (``run``, or None) and progress bar. Call
    :meth:`resume`, :meth:`start`, :meth:`step` after each update, :meth:`finish`; ``stop`` is
    why the loop must stop (``"budget"``), else None."""

    def __init__(self, run: Any, show_progress: bool):
        self.run = run
        self.show_progress = show_progress
        self.bar: Any = None
        self.stop: str | None = None
        self.started = 0.0

    def resume(self) -> LoopState | None:
        """The newest checkpoint's (position, tensors), or None."""
        return self.run.resume() if self.run is not None else None

    def start(self, model: LoopModel, total: int, done: int, desc: str, unit: str) -> None:
        """Start the run's clock and cost tracker and the bar (``done`` of ``total`` units)."""
        from lmlab.utils.progress import progress

        if self.run is not None:
            self.run.start(model)
        if self.show_progress:
            self.bar = progress(total=total, desc=desc, unit=unit, unit_scale=True,
                                initial=done)
        self.started = time.perf_counter()
        if self.run is not None and self.run.out_of_time():
            self.stop = "budget"

    def step(self, units: int, flops: float, snapshot: Callable[[], LoopState]) -> str | None:
        """Count a step of ``units`` (words, entries): checkpoints and budget; the stop reason."""
        if self.bar is not None:
            self.bar.update(units)
        if self.run is not None:
            self.stop = self.run.after_step(units, flops, snapshot)
        return self.stop

    def finish(self, snapshot: Callable[[], LoopState]) -> tuple[float, dict | None]:
        """Close the bar and the run (a last checkpoint unless stopped): (seconds trained this
        session, the run's cost report or None)."""
        if self.bar is not None:
            self.bar.close()
        seconds = time.perf_counter() - self.started
        if self.run is None:
            return seconds, None
        reason = self.stop or "epochs"
        return seconds, self.run.finish(None if self.stop else snapshot(), reason).to_dict()
