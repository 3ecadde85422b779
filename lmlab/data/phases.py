"""Streams whose shape changes during training: BERT's sequence-length schedule (128 tokens for
90% of the steps, then 512: :class:`PhasedStream`, one stream per length) and GPT-3's batch-size
ramp (:func:`ramped_batch_size`). Both are pure functions of the position, so a resumed run
continues exactly (docs/training.md, "Sequence-length schedule and batch-size ramp")."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from lmlab.utils.errors import LmlabError


def ramped_batch_size(tokens: int, batch_size: int, seq_len: int, start_tokens: int,
                      ramp_tokens: int, multiple: int = 1) -> int:
    """Sequences in the next batch after ``tokens`` training tokens, GPT-3's ramp: the batch
    in tokens grows linearly from ``start_tokens`` to the full ``batch_size x seq_len`` over the
    first ``ramp_tokens`` tokens (rounded down to whole sequences and to a ``multiple`` of the
    process count, at least one of each)."""
    full = batch_size * seq_len
    share = min(1.0, tokens / ramp_tokens)
    size = min(batch_size, int((start_tokens + (full - start_tokens) * share) // seq_len))
    return max(size - size % multiple, multiple, 1)


class PhasedStream:
    """``streams`` one after another, each for ``lengths`` batches (``None``: to the end); its
    state is the phase, the batches into it and every stream's own. A stream with a
    ``tokens_before`` attribute is told the tokens its predecessors yielded (the batch ramp
    counts from the run's start)."""

    def __init__(self, streams: Sequence[Any], lengths: Sequence[int | None]):
        if len(streams) != len(lengths) or not streams:
            raise LmlabError("a phased stream needs one length per stream",
                             "pass as many lengths as streams")
        self.streams, self.lengths = list(streams), list(lengths)
        self.phase, self.in_phase = 0, 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while self.phase < len(self.streams):
            stream, limit = self.streams[self.phase], self.lengths[self.phase]
            if hasattr(stream, "tokens_before"):
                stream.tokens_before = sum(s.tokens_seen for s in self.streams[:self.phase])
            if limit is None or self.in_phase < limit:
                for batch in stream:
                    self.in_phase += 1  # the state after this batch, as the stream's own
                    yield batch
                    if limit is not None and self.in_phase >= limit:
                        break
                else:
                    return  # a finite stream ran out
            if limit is None:
                return
            self.phase, self.in_phase = self.phase + 1, 0

    @property
    def seq_len(self) -> int:
        """The sequence length of the current phase."""
        return self.streams[min(self.phase, len(self.streams) - 1)].seq_len

    @property
    def tokens_seen(self) -> int:
        return sum(stream.tokens_seen for stream in self.streams)

    def state_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "in_phase": self.in_phase, "lengths": self.lengths,
                "streams": [stream.state_dict() for stream in self.streams]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict` of the same phases."""
        if list(state.get("lengths", [])) != self.lengths:
            raise LmlabError(f"the saved stream has phases of {state.get('lengths')} batches, "
                             f"this one {self.lengths}", "resume with the same schedule")
        for stream, saved in zip(self.streams, state["streams"]):
            stream.load_state_dict(saved)
        self.phase, self.in_phase = int(state["phase"]), int(state["in_phase"])
