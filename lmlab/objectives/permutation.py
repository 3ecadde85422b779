"""XLNet's permutation language modelling (Yang et al. 2019; ``"plm"``): spans chosen as
transformers' ``DataCollatorForPermutationLanguageModeling`` does are the last tokens of a random
factorisation order (partial prediction: about 1/K of the tokens, K = 1 / plm_probability), each
predicted by the query stream from the tokens before it in that order (docs/objectives.md)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from lmlab.objectives.base import Objective, ObjectiveResult, require_labels, stack_inputs
from lmlab.objectives.masking import IGNORE_INDEX, candidate_mask
from lmlab.objectives.special_tokens import SpecialTokens
from lmlab.utils.checks import check_at_least
from lmlab.utils.errors import LmlabError


def sample_spans(length: int, probability: float, max_span: int,
                 rng: np.random.Generator) -> np.ndarray:
    """Boolean (T,) spans as the collator draws them: a length L uniform in 1..max_span, a
    context of int(L / probability) tokens from the current point, the span at a uniform offset
    inside it; repeated from the context's end until the row is covered."""
    chosen = np.zeros(length, dtype=bool)
    start = 0
    while start < length:
        span = int(rng.integers(1, max_span + 1))
        context = int(span / probability)
        first = start + int(rng.integers(0, context - span + 1))
        chosen[first:first + span] = True
        start += context
    return chosen


def factorisation_mask(targets: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """perm_mask (T, T), 1 = i may not see j: the targets come last in a random order, each
    seeing the targets before it (not itself); every other token sees no target."""
    rank = np.full(len(targets), -1, dtype=np.int64)
    rank[targets] = rng.permutation(int(targets.sum()))
    return (rank[:, None] <= rank[None, :]) & targets[None, :]  # other tokens rank -1


class PermutationLM(Objective):
    """Permutation LM on the ``plm`` head: ``plm_probability`` of the tokens in spans of up to
    ``max_span_length`` (transformers' defaults, 1/6 and 5) predicted through ``perm_mask`` and
    ``target_mapping``; the content stream keeps every real token, as the paper's."""

    name = "plm"
    head_names = ("plm",)
    salt = 11
    flops_head = "plm"  # the query stream and one projection per predicted token
    reports_perplexity = True
    shares_forward_pass = False  # it runs the query stream (perm_mask, target_mapping)
    shown = ("plm_probability", "max_span_length")

    def __init__(self, special: SpecialTokens, plm_probability: float = 1 / 6,
                 max_span_length: int = 5, weight: float = 1.0):
        super().__init__(special, weight)
        if not 0.0 < plm_probability < 1.0:
            raise LmlabError(f"plm_probability {plm_probability} is not in (0, 1)",
                             "use about 1/6 (XLNet's K = 6) or 1/7 (K = 7)")
        check_at_least(max_span_length, 1, "max_span_length")
        if int(max_span_length / plm_probability) < max_span_length:
            raise LmlabError("a span would not fit its context", "lower max_span_length")
        self.plm_probability, self.max_span_length = float(plm_probability), int(max_span_length)
        self._special_ids = np.asarray(special.special_ids, dtype=np.int64)

    @property
    def predicted_fraction(self) -> float:
        return self.plm_probability

    def corrupt(self, batch: dict[str, torch.Tensor],
                rng: torch.Generator) -> dict[str, torch.Tensor]:
        """``perm_mask`` (B, T, T), ``target_mapping`` (B, M, T) one row per predicted token in
        position order (M: the most in a row; rows beyond a row's count are zero) and
        ``labels`` (B, M) (-100 on those rows); ``input_ids`` unchanged."""
        ids = batch["input_ids"].numpy()
        attention = (batch["attention_mask"].numpy() if "attention_mask" in batch
                     else ids != self.special.pad_id)
        candidates = candidate_mask(ids, attention, self._special_ids)  # (B, T)
        rows, length = ids.shape
        perm = np.zeros((rows, length, length), dtype=np.float32)
        chosen = []
        for row, gen in enumerate(self.row_generators(batch, rng)):
            targets = sample_spans(length, self.plm_probability, self.max_span_length, gen) \
                & candidates[row]
            perm[row] = factorisation_mask(targets, gen)
            chosen.append(np.flatnonzero(targets))
        predictions = max(1, max(len(c) for c in chosen))
        mapping = np.zeros((rows, predictions, length), dtype=np.float32)
        labels = np.full((rows, predictions), IGNORE_INDEX, dtype=np.int64)
        for row, positions in enumerate(chosen):
            mapping[row, np.arange(len(positions)), positions] = 1.0
            labels[row, :len(positions)] = ids[row, positions]
        return dict(batch, perm_mask=torch.from_numpy(perm),
                    target_mapping=torch.from_numpy(mapping), labels=torch.from_numpy(labels))

    def compute_loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> ObjectiveResult:
        """The query stream at the predicted positions, the ``plm`` head on its real rows."""
        labels = require_labels(batch, self.name)
        if "perm_mask" not in batch or "target_mapping" not in batch:
            raise LmlabError("the batch has no perm_mask/target_mapping for 'plm'",
                             "corrupt batches with objective.corrupt (PretrainingStream does)")
        out = model(**stack_inputs(model, batch), perm_mask=batch["perm_mask"],
                    target_mapping=batch["target_mapping"], use_mems=False, heads=[])
        real = labels != IGNORE_INDEX  # (B, M)
        head = model.heads["plm"]
        logits = head(out.last_hidden_state[real])  # (N, V): only the predicted tokens
        targets = labels[real]
        count = int(real.sum())
        loss = head.loss(logits, targets) if count else logits.sum() * 0.0
        with torch.no_grad():
            accuracy = float((logits.argmax(-1) == targets).sum()) / max(count, 1)
        value = float(loss.detach())
        metrics = {"plm_loss": value, "plm_accuracy": accuracy,
                   "plm_perplexity": float(np.exp(min(value, 50.0)))}
        return ObjectiveResult(loss * self.weight, metrics, count)
