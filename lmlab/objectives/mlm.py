"""Masked language modelling (BERT, RoBERTa) and whole-word masking, with static or dynamic
masking, sparse prediction and DeBERTa's enhanced mask decoder (docs/objectives.md)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from lmlab.objectives.base import Objective, ObjectiveResult, require_labels, stack_inputs
from lmlab.objectives.masking import (
    IGNORE_INDEX,
    candidate_mask,
    check_rate,
    check_split,
    choose_tokens,
    choose_whole_words,
    replace_tokens,
)
from lmlab.objectives.special_tokens import SpecialTokens
from lmlab.utils.checks import check_at_least, check_choice
from lmlab.utils.errors import LmlabError

MASKING_MODES = ("dynamic", "static")


class MaskedLM(Objective):
    """BERT's masked-LM objective (token-level masking). Arguments: the share of tokens
    predicted, the (mask, random, keep) split, ``"dynamic"``/``"static"`` masking with its
    ``dupe_factor`` and ``seed``, BERT's ``max_predictions`` cap per sequence, sparse
    prediction, the weight in a combination and ``enhanced_mask_decoder`` (DeBERTa's: the
    ``emd`` head instead of ``mlm``; docs/objectives.md's table)."""

    name = "mlm"
    head_names = ("mlm",)
    corrupts_tokens = True
    salt = 1
    flops_head = "mlm"
    reports_perplexity = True
    needs_words = False  # choose() reads the batch's word starts
    shown = ("mask_prob", "replacement", "masking", "dupe_factor", "sparse")

    def __init__(self, special: SpecialTokens, mask_prob: float = 0.15,
                 replacement: tuple[float, float, float] = (0.8, 0.1, 0.1),
                 masking: str = "dynamic", dupe_factor: int = 10, seed: int = 0,
                 max_predictions: int | None = None, sparse: bool = True, weight: float = 1.0,
                 enhanced_mask_decoder: bool = False):
        super().__init__(special, weight)
        self.enhanced_mask_decoder = bool(enhanced_mask_decoder)
        if self.enhanced_mask_decoder:  # it reads the last layer's input: its own forward pass
            self.head_names, self.shares_forward_pass = ("emd",), False
            self.flops_head = "emd"  # the cost report counts its passes of the last layer
        special.require_mask()
        check_choice(masking, MASKING_MODES, "masking", "masking mode")
        check_at_least(dupe_factor, 1, "dupe_factor")
        self.mask_prob = check_rate(mask_prob)
        self.replacement = check_split(replacement)
        self.masking = masking
        self.dupe_factor = int(dupe_factor)
        self.seed = int(seed)
        self.max_predictions = max_predictions
        self.sparse = bool(sparse)
        pool = np.setdiff1d(np.arange(special.vocab_size), np.asarray(special.special_ids))
        self._random_pool = pool.astype(np.int64)
        self._special_ids = np.asarray(special.special_ids, dtype=np.int64)

    @property
    def predicted_fraction(self) -> float | None:
        return self.mask_prob if self.sparse else None

    @property
    def static(self) -> bool:
        return self.masking == "static"

    def data_epoch(self, epoch: int) -> int:
        return epoch % self.dupe_factor if self.static else epoch


    def choose(self, candidates: np.ndarray, word_starts: np.ndarray | None,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None, Any]:
        """Positions to predict in one row: (chosen mask, replacement groups or None, extra)."""
        return choose_tokens(candidates, self.mask_prob, rng, self.max_predictions), None, None

    def mask_rows(self, batch: dict[str, torch.Tensor], rng: torch.Generator
                  ) -> tuple[np.ndarray, np.ndarray, list[Any]]:
        """Corrupted ids (B, T), labels (B, T) and each row's ``extra`` from :meth:`choose`."""
        ids = batch["input_ids"].numpy()
        attention = (batch["attention_mask"].numpy() if "attention_mask" in batch
                     else (ids != self.special.pad_id))
        word_starts = batch["word_starts"].numpy() if "word_starts" in batch else None
        if self.needs_words and word_starts is None:
            raise LmlabError(f"{self.name!r} masking needs 'word_starts' in the batch",
                             "build batches with PretrainingStream from token shards (they "
                             "store word starts)")
        generators = self.row_generators(batch, rng, self.static, self.seed, self.dupe_factor)
        corrupted = np.empty(ids.shape, dtype=np.int64)
        labels = np.empty(ids.shape, dtype=np.int64)
        extras = []
        all_candidates = candidate_mask(ids, attention, self._special_ids)  # (B, T)
        for row, gen in enumerate(generators):
            candidates = all_candidates[row]
            starts = None if word_starts is None else word_starts[row]
            chosen, groups, extra = self.choose(candidates, starts, gen)
            corrupted[row], labels[row] = replace_tokens(
                ids[row], chosen, self.replacement, gen, self.special.mask_id,
                self._random_pool, groups)
            extras.append(extra)
        return corrupted, labels, extras

    def corrupt(self, batch: dict[str, torch.Tensor],
                rng: torch.Generator) -> dict[str, torch.Tensor]:
        """``input_ids`` corrupted and ``labels`` (original ids where predicted, else -100)."""
        corrupted, labels, _ = self.mask_rows(batch, rng)
        return dict(batch, input_ids=torch.from_numpy(corrupted), labels=torch.from_numpy(labels))

    def compute_loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> ObjectiveResult:
        """One forward pass; the enhanced mask decoder reads the last layer's input."""
        if not self.enhanced_mask_decoder:
            return super().compute_loss(model, batch)
        out = model(**stack_inputs(model, batch), heads=[], output_hidden_states=True)
        result = self.losses(model, batch, out.hidden_states[-2], out.pooler_output)
        return ObjectiveResult(result.loss * self.weight, result.metrics, result.num_predictions)

    def losses(self, model: nn.Module, batch: dict[str, torch.Tensor], hidden: torch.Tensor,
               pooled: torch.Tensor | None) -> ObjectiveResult:
        labels = require_labels(batch, self.name)
        positions = labels != IGNORE_INDEX  # (B, T)
        count = int(positions.sum())
        name = self.head_names[0]  # "mlm", or "emd" reading the last layer's input as hidden
        head = model.heads[name]
        mask = batch.get("attention_mask")
        if self.sparse:
            logits = model.run_head(name, hidden, pooled, mask, positions=positions)  # (N, V)
            targets = labels[positions]  # (N,)
        else:
            logits = model.run_head(name, hidden, pooled, mask)  # (B, T, V)
            targets = labels
        if count == 0:
            loss = logits.sum() * 0.0
            return ObjectiveResult(loss, {"mlm_loss": 0.0, "mlm_accuracy": 0.0}, 0)
        loss = head.loss(logits, targets)
        with torch.no_grad():
            predicted = logits.argmax(-1)
            correct = (predicted == targets) & (targets != IGNORE_INDEX)
            accuracy = float(correct.sum()) / count
        return ObjectiveResult(loss, {"mlm_loss": float(loss.detach()),
                                      "mlm_accuracy": accuracy}, count)


class WholeWordMaskedLM(MaskedLM):
    """Masked LM where every piece of a chosen word is masked (BERT's whole-word masking);
    words come from the batch's ``word_starts`` (B, T), stored in the shards for any tokenizer."""

    name = "wwm"
    salt = 2
    needs_words = True

    def choose(self, candidates: np.ndarray, word_starts: np.ndarray | None,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None, Any]:
        chosen = choose_whole_words(candidates, word_starts, self.mask_prob, rng,
                                    self.max_predictions)
        return chosen, None, None
