"""SpanBERT (Joshi et al. 2020): span masking + the span boundary objective (SBO), which
predicts each masked token from the two tokens just outside its span and its offset in it
(docs/objectives.md)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from lmlab.objectives.base import ObjectiveResult, accuracy
from lmlab.objectives.masking import IGNORE_INDEX, choose_spans
from lmlab.objectives.mlm import MaskedLM
from lmlab.objectives.special_tokens import SpecialTokens
from lmlab.utils.errors import LmlabError


class SpanMaskedLM(MaskedLM):
    """SpanBERT: span masking, MLM loss + span boundary objective. Beyond MaskedLM's
    arguments: the span lengths' distribution (``geometric_p``, ``min_span_length``,
    ``max_span_length`` in words) and the SBO term (``sbo``: on or off, ``sbo_weight``)."""

    name = "span"
    salt = 3
    needs_words = True

    def __init__(self, special: SpecialTokens, mask_prob: float = 0.15,
                 replacement: tuple[float, float, float] = (0.8, 0.1, 0.1),
                 masking: str = "dynamic", dupe_factor: int = 10, seed: int = 0,
                 max_predictions: int | None = None, sparse: bool = True, weight: float = 1.0,
                 geometric_p: float = 0.2, max_span_length: int = 10, min_span_length: int = 1,
                 sbo: bool = True, sbo_weight: float = 1.0):
        super().__init__(special, mask_prob, replacement, masking, dupe_factor, seed,
                         max_predictions, sparse, weight)
        self.geometric_p = float(geometric_p)
        self.max_span_length = int(max_span_length)
        self.min_span_length = int(min_span_length)
        self.sbo = bool(sbo)
        self.sbo_weight = float(sbo_weight)
        self.head_names = ("mlm", "sbo") if self.sbo else ("mlm",)
        self.reports_perplexity = not self.sbo  # with SBO the loss is a sum of two losses

    def choose(self, candidates: np.ndarray, word_starts: np.ndarray | None,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None, Any]:
        chosen, spans = choose_spans(candidates, word_starts, self.mask_prob, rng,
                                     self.geometric_p, self.max_span_length,
                                     self.min_span_length, self.max_predictions)
        groups = np.full(len(candidates), -1, dtype=np.int64)
        for index, (start, end, _) in enumerate(spans):
            groups[start:end] = index
        return chosen, groups, spans

    def corrupt(self, batch: dict[str, torch.Tensor],
                rng: torch.Generator) -> dict[str, torch.Tensor]:
        """Adds ``sbo_left``, ``sbo_right``, ``sbo_offset`` (B, T): boundary positions and the
        offset inside the span of each masked token (0 elsewhere); ``span_lengths`` (B, S)
        holds each span's length in words (0-padded), for statistics."""
        corrupted, labels, extras = self.mask_rows(batch, rng)
        rows, length = corrupted.shape
        left = np.zeros((rows, length), dtype=np.int64)
        right = np.zeros((rows, length), dtype=np.int64)
        offset = np.zeros((rows, length), dtype=np.int64)
        most = max((len(spans) for spans in extras), default=0)
        span_lengths = np.zeros((rows, max(most, 1)), dtype=np.int64)
        for row, spans in enumerate(extras):
            for index, (start, end, words) in enumerate(spans):
                left[row, start:end] = max(start - 1, 0)
                right[row, start:end] = min(end, length - 1)
                offset[row, start:end] = np.arange(end - start)
                span_lengths[row, index] = words
        return dict(batch, input_ids=torch.from_numpy(corrupted), labels=torch.from_numpy(labels),
                    sbo_left=torch.from_numpy(left), sbo_right=torch.from_numpy(right),
                    sbo_offset=torch.from_numpy(offset),
                    span_lengths=torch.from_numpy(span_lengths))

    def losses(self, model: nn.Module, batch: dict[str, torch.Tensor], hidden: torch.Tensor,
               pooled: torch.Tensor | None) -> ObjectiveResult:
        mlm = super().losses(model, batch, hidden, pooled)
        if not self.sbo or mlm.num_predictions == 0:
            return mlm
        for key in ("sbo_left", "sbo_right", "sbo_offset"):
            if key not in batch:
                raise LmlabError(f"the batch has no {key!r} for the span boundary objective",
                                 "corrupt batches with the span objective's corrupt()")
        positions = batch["labels"] != IGNORE_INDEX  # (B, T)
        logits = model.run_head("sbo", hidden, pooled, positions=positions,
                                left=batch["sbo_left"], right=batch["sbo_right"],
                                offset=batch["sbo_offset"])  # (N, V)
        targets = batch["labels"][positions]
        sbo_loss = model.heads["sbo"].loss(logits, targets)
        metrics = dict(mlm.metrics, sbo_loss=float(sbo_loss.detach()),
                       sbo_accuracy=accuracy(logits, targets))
        return ObjectiveResult(mlm.loss + self.sbo_weight * sbo_loss, metrics,
                               mlm.num_predictions)
