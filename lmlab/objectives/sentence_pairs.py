"""Next-sentence prediction (BERT) and sentence-order prediction (ALBERT): classify
``[CLS] A [SEP] B [SEP]`` from the pooled vector; the data stream builds the pairs
(docs/objectives.md)."""

from __future__ import annotations

import torch
from torch import nn

from lmlab.objectives.base import Objective, ObjectiveResult, accuracy
from lmlab.utils.errors import LmlabError


class _SentencePairObjective(Objective):
    example_format = "segment_pairs"
    label_key = ""
    pair_mode = ""

    def losses(self, model: nn.Module, batch: dict[str, torch.Tensor], hidden: torch.Tensor,
               pooled: torch.Tensor | None) -> ObjectiveResult:
        if self.label_key not in batch:
            raise LmlabError(f"the batch has no {self.label_key!r} for {self.name.upper()}",
                             "stream segment pairs: PretrainingStream(..., objective=...) uses "
                             "the 'segment_pairs' format for this objective")
        if pooled is None:
            raise LmlabError(f"the model has no pooler, which {self.name.upper()} reads",
                             "call objective.prepare(model) before training")
        labels = batch[self.label_key].reshape(-1)
        logits = model.run_head(self.name, hidden, pooled)  # (B, 2)
        loss = model.heads[self.name].loss(logits, labels)
        return ObjectiveResult(loss, {f"{self.name}_loss": float(loss.detach()),
                                      f"{self.name}_accuracy": accuracy(logits, labels)},
                               int(labels.numel()))


class NextSentencePrediction(_SentencePairObjective):
    """BERT's NSP: is B the continuation of A (0) or a random segment (1)?"""

    name = "nsp"
    head_names = ("nsp",)
    label_key = "next_sentence_label"
    pair_mode = "nsp"


class SentenceOrderPrediction(_SentencePairObjective):
    """ALBERT's SOP: are the two consecutive segments in order (0) or swapped (1)?"""

    name = "sop"
    head_names = ("sop",)
    label_key = "sentence_order_label"
    pair_mode = "sop"
