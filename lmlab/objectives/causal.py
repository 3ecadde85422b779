"""Causal language modelling (GPT-2, Llama; ``"clm"``, optionally masked between packed
documents) and prefix language modelling (UniLM, T5; ``"prefix-lm"``), both on the ``"clm"``
head (docs/decoders.md)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from lmlab.models.core.masks import document_mask, prefix_lm_mask
from lmlab.models.heads import IGNORE_INDEX
from lmlab.objectives.base import Objective, ObjectiveResult, require_labels, stack_inputs
from lmlab.objectives.linear_cross_entropy import projected_cross_entropy
from lmlab.objectives.special_tokens import SpecialTokens
from lmlab.utils.errors import LmlabError


def _padding_mask(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(B, T) 1 for real tokens: the batch's 2-D attention mask, or all ones."""
    ids = batch["input_ids"]
    mask = batch.get("attention_mask")
    if mask is None or mask.dim() != 2:
        return torch.ones_like(ids)
    return mask


def lm_labels(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(B, T) the input ids as labels, -100 at padding."""
    return batch["input_ids"].masked_fill(_padding_mask(batch) == 0, IGNORE_INDEX)


def document_ids(input_ids: torch.Tensor, separator_ids: tuple[int, ...]) -> torch.Tensor:
    """(B, T) index of the document each token belongs to; a separator ends its document."""
    separators = torch.tensor(separator_ids, dtype=input_ids.dtype, device=input_ids.device)
    ends = torch.isin(input_ids, separators).long()
    return torch.cumsum(ends, dim=1) - ends  # the separator stays in the document it closes


def activation_penalties(dropped: torch.Tensor, raw: torch.Tensor, padding: torch.Tensor,
                         ar: float, tar: float) -> torch.Tensor:
    """AWD-LSTM's AR ``ar * mean(dropped ** 2)`` on the last layer's dropped output and TAR
    ``tar * mean((raw_t - raw_{t-1}) ** 2)`` on its raw output (Merity et al. 2017, Section 4.6),
    means over the real positions (``padding`` (B, T) 1 for real tokens) and units."""
    real = padding.to(dropped.dtype).unsqueeze(-1)  # (B, T, 1)
    width = dropped.shape[-1]
    penalty = ar * (dropped.pow(2) * real).sum() / (real.sum() * width).clamp(min=1)
    both = real[:, 1:] * real[:, :-1]  # (B, T-1, 1): consecutive real positions
    steps = (raw[:, 1:] - raw[:, :-1]).pow(2) * both
    return penalty + tar * steps.sum() / (both.sum() * width).clamp(min=1)


class CausalLM(Objective):
    """Next-token prediction over packed token windows; ``separate_documents`` masks attention
    between the packed documents (cut after ``eos_id``/``sep_id``); ``ar``/``tar`` add
    AWD-LSTM's activation and temporal activation regularisation (:func:`activation_penalties`;
    Merity et al.: 2 and 1)."""

    name = "clm"
    head_names = ("clm",)
    flops_head = "clm"
    reports_perplexity = True
    cls_sep_packing = False

    def __init__(self, special: SpecialTokens, separate_documents: bool = False,
                 weight: float = 1.0, ar: float = 0.0, tar: float = 0.0):
        super().__init__(special, weight)
        self.separate_documents = bool(separate_documents)
        for name, value in (("ar", ar), ("tar", tar)):
            if not value >= 0:
                raise LmlabError(f"{name} {value} is negative", f"use {name} >= 0 (AWD-LSTM: "
                                 "ar 2, tar 1)")
        self.ar, self.tar = float(ar), float(tar)
        ids = {i for i in (special.eos_id, special.sep_id) if i is not None}
        self.separator_ids = tuple(sorted(ids))

    def corrupt(self, batch: dict[str, torch.Tensor],
                rng: torch.Generator) -> dict[str, torch.Tensor]:
        """Labels are the inputs (padding -> -100); optionally the per-document mask."""
        out = dict(batch)
        ids = batch["input_ids"]
        padding = _padding_mask(batch)
        labels = lm_labels(batch)
        if self.separate_documents:
            docs = batch.get("document_ids")
            if docs is None:
                docs = document_ids(ids, self.separator_ids)
            mask = document_mask(docs, causal=True) & padding.bool().unsqueeze(1)  # (B, T, T)
            out["attention_mask"] = mask
            # The first token of a document is not predictable from another document.
            starts = torch.zeros_like(labels, dtype=torch.bool)
            starts[:, 1:] = docs[:, 1:] != docs[:, :-1]
            labels = labels.masked_fill(starts, IGNORE_INDEX)
            out["document_ids"] = docs
        out["labels"] = labels
        return out

    def prepare(self, model: nn.Module) -> None:
        family = getattr(getattr(model, "config", None), "family", None)
        if (self.ar or self.tar) and family != "awd-lstm":
            raise LmlabError(f"ar/tar regularise an AWD-LSTM's last LSTM layer; a {family} "
                             "model has none", "drop ar and tar, or use --family awd-lstm")
        super().prepare(model)

    def compute_loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> ObjectiveResult:
        if not (self.ar or self.tar) or not self.training:
            return super().compute_loss(model, batch)
        out = model(**stack_inputs(model, batch), heads=[], output_hidden_states=True)
        result = self.losses(model, batch, out.last_hidden_state, None)
        penalty = activation_penalties(out.last_hidden_state, out.hidden_states[-1],
                                       _padding_mask(batch), self.ar, self.tar)
        metrics = {**result.metrics, f"{self.name}_activation_penalty": float(penalty.detach())}
        return ObjectiveResult((result.loss + penalty) * self.weight, metrics,
                               result.num_predictions)

    def losses(self, model: nn.Module, batch: dict[str, torch.Tensor], hidden: torch.Tensor,
               pooled: torch.Tensor | None) -> ObjectiveResult:
        labels = require_labels(batch, self.name)
        head = model.heads["clm"]
        targets = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)  # (B, T): next token or -100
        count = int((targets != IGNORE_INDEX).sum())
        projection = getattr(head, "decoder", None)
        if isinstance(projection, nn.Linear):
            # the projection and the loss fused in chunks: the (B, T, V) logits never exist;
            # only predicted positions are projected (not padding, not each row's last token)
            loss, correct = projected_cross_entropy(hidden, projection, targets)
        else:  # a custom head: its own logits and loss
            logits = head(hidden)  # (B, T, V)
            loss = head.loss(logits, labels)
            with torch.no_grad():
                correct = ((logits.argmax(-1) == targets) & (targets != IGNORE_INDEX)).sum()
        accuracy = float(correct) / max(count, 1)
        value = float(loss.detach())
        metrics = {f"{self.name}_loss": value, f"{self.name}_accuracy": accuracy,
                   f"{self.name}_perplexity": float(torch.exp(torch.tensor(min(value, 50.0))))}
        return ObjectiveResult(loss, metrics, count)


class PrefixLM(CausalLM):
    """Prefix LM: a bidirectional prefix of random length (a share of each row's real tokens
    between ``min_prefix`` and ``max_prefix``), then causal prediction of the rest."""

    name = "prefix-lm"

    def __init__(self, special: SpecialTokens, min_prefix: float = 0.1, max_prefix: float = 0.9,
                 weight: float = 1.0):
        super().__init__(special, separate_documents=False, weight=weight)
        if not 0.0 <= min_prefix <= max_prefix < 1.0:
            raise LmlabError(f"prefix bounds ({min_prefix}, {max_prefix}) are not valid",
                             "use 0 <= min_prefix <= max_prefix < 1, e.g. 0.1 and 0.9")
        self.min_prefix, self.max_prefix = float(min_prefix), float(max_prefix)

    def corrupt(self, batch: dict[str, torch.Tensor],
                rng: torch.Generator) -> dict[str, torch.Tensor]:
        out = dict(batch)
        ids = batch["input_ids"]
        padding = _padding_mask(batch)
        lengths = padding.sum(dim=1)  # (B,)
        share = torch.rand(ids.shape[0], generator=rng)
        share = self.min_prefix + (self.max_prefix - self.min_prefix) * share
        prefix = (share * lengths).long().clamp(min=1)
        prefix = torch.minimum(prefix, (lengths - 1).clamp(min=1))  # keep >= 1 target
        positions = torch.arange(ids.shape[1]).unsqueeze(0)  # (1, T)
        labels = ids.masked_fill((padding == 0) | (positions < prefix.unsqueeze(1)), IGNORE_INDEX)
        mask = prefix_lm_mask(prefix, ids.shape[1]) & padding.bool().unsqueeze(1)  # (B, T, T)
        out.update(labels=labels, attention_mask=mask, prefix_lengths=prefix)
        return out
