"""Extractive QA decoding: from start/end logits of every window to one answer per question.

For each window the ``n_best`` highest start and end logits are paired; a pair is a candidate
when both ends lie in the context, ``start <= end`` and the span is at most
``max_answer_length`` tokens. Its score is ``start_logit + end_logit``; the best candidate over
all windows of a question wins. SQuAD 2.0: the null answer's score is the smallest
``start[CLS] + end[CLS]`` over the windows; the question is answered "" when
``null_score - best_score > null_threshold`` (threshold 0.0 = plain comparison).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class Span:
    """A candidate answer: text, character span in the context and score."""

    text: str
    start: int
    end: int
    score: float


def best_spans(start_logits: Sequence[float], end_logits: Sequence[float],
               offsets: Sequence[tuple[int, int] | None], context: str, n_best: int = 20,
               max_answer_length: int = 30) -> list[Span]:
    """The valid spans of one window, best first (see module doc)."""
    import numpy as np

    start = np.asarray(start_logits, dtype=np.float64)
    end = np.asarray(end_logits, dtype=np.float64)
    starts = np.argsort(start)[::-1][:n_best]
    ends = np.argsort(end)[::-1][:n_best]
    spans = []
    for s in starts:
        for e in ends:
            if s >= len(offsets) or e >= len(offsets) or offsets[s] is None or offsets[e] is None:
                continue
            if e < s or e - s + 1 > max_answer_length:
                continue
            a, b = offsets[s][0], offsets[e][1]
            spans.append(Span(context[a:b], int(a), int(b), float(start[s] + end[e])))
    spans.sort(key=lambda span: -span.score)
    return spans


def decode_answers(windows: Sequence[dict[str, Any]], contexts: Sequence[str],
                   n_best: int = 20, max_answer_length: int = 30, allow_null: bool = False,
                   null_threshold: float = 0.0) -> list[dict[str, Any]]:
    """``[{"answer", "start", "end", "score", "null_score"}]`` in question order from the
    windows' ``{"example_index", "start_logits", "end_logits", "offsets"}`` (offsets None outside
    the context); ``allow_null``: SQuAD 2.0 (see the module doc)."""
    best: dict[int, Span] = {}
    null: dict[int, float] = {}
    for window in windows:
        index = int(window["example_index"])
        context = contexts[index]
        spans = best_spans(window["start_logits"], window["end_logits"], window["offsets"],
                           context, n_best, max_answer_length)
        if spans and (index not in best or spans[0].score > best[index].score):
            best[index] = spans[0]
        score = float(window["start_logits"][0] + window["end_logits"][0])
        null[index] = min(null.get(index, score), score)
    answers = []
    for index in range(len(contexts)):
        span = best.get(index)
        null_score = null.get(index, float("-inf"))
        if span is None or (allow_null and null_score - span.score > null_threshold):
            answers.append({"answer": "", "start": None, "end": None,
                            "score": null_score, "null_score": null_score})
        else:
            answers.append({"answer": span.text, "start": span.start, "end": span.end,
                            "score": span.score, "null_score": null_score})
    return answers
