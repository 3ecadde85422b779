"""Sentence-pair objectives: next-sentence prediction (BERT) and sentence-order prediction
(ALBERT).

Both read the pooled [CLS] vector of ``[CLS] A [SEP] B [SEP]`` and classify the pair:

* NSP (Devlin et al. 2019): label 0 = B is the text that followed A, 1 = B is a random segment
  from another document (50% of pairs). RoBERTa found removing it does not hurt.
* SOP (Lan et al. 2020): both segments come from the same document; label 0 = in order,
  1 = swapped (50%). It targets coherence rather than topic, which NSP mostly learns.

The pairs and labels are built by the data stream
(:func:`lmlab.data.pretraining.create_segment_pairs`, BERT's ``create_pretraining_data.py``
algorithm); these objectives only add the head and the loss. They compose with a masking
objective: ``build_objective("mlm,sop", special)``.
"""

from __future__ import annotations

import torch
from torch import nn

from lmlab.objectives.base import Objective, ObjectiveResult
from lmlab.objectives.special_tokens import SpecialTokens
from lmlab.utils.errors import LmlabError


class _SentencePairObjective(Objective):
    example_format = "segment_pairs"
    label_key = ""
    pair_mode = ""

    def __init__(self, special: SpecialTokens, weight: float = 1.0):
        super().__init__(special, weight)

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
        with torch.no_grad():
            accuracy = float((logits.argmax(-1) == labels).float().mean())
        return ObjectiveResult(loss, {f"{self.name}_loss": float(loss.detach()),
                                      f"{self.name}_accuracy": accuracy}, int(labels.numel()))


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
