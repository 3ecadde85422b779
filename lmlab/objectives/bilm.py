"""ELMo's bidirectional language modelling (Peters et al. 2018), ``"bilm"``: the forward LSTM
predicts token t+1, the backward one token t-1, through one shared softmax; the loss is the
mean of the two (docs/recurrent.md)."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from lmlab.models.heads import IGNORE_INDEX
from lmlab.objectives.base import Objective, ObjectiveResult, require_labels
from lmlab.objectives.causal import lm_labels
from lmlab.objectives.linear_cross_entropy import projected_cross_entropy
from lmlab.utils.errors import LmlabError


class BidirectionalLM(Objective):
    """Forward + backward LM losses with a shared softmax, on an ELMo model."""

    name = "bilm"
    head_names = ("bilm",)
    flops_head = "clm"
    reports_perplexity = True
    cls_sep_packing = False

    def prepare(self, model: nn.Module) -> None:
        if getattr(model, "lm_head", None) != "bilm":
            family = getattr(getattr(model, "config", None), "family", type(model).__name__)
            raise LmlabError(f"the bilm objective trains a bidirectional LSTM LM with separate "
                             f"directions (ELMo); a {family} model has none",
                             "use --family elmo with --objective bilm (clm for left-to-right "
                             "models)")
        super().prepare(model)

    def corrupt(self, batch: dict[str, torch.Tensor],
                rng: torch.Generator) -> dict[str, torch.Tensor]:
        """Labels are the inputs, padding -> -100."""
        return dict(batch, labels=lm_labels(batch))

    def losses(self, model: nn.Module, batch: dict[str, torch.Tensor], hidden: torch.Tensor,
               pooled: torch.Tensor | None) -> ObjectiveResult:
        labels = require_labels(batch, self.name)
        width = hidden.shape[-1] // 2
        decoder = model.heads["bilm"].decoder  # (V, P) weight and (V,) bias, both directions
        # a padded position (its own label ignored) predicts nothing: the backward LM at the
        # first padding would otherwise be scored on the row's last real token
        padded = labels == IGNORE_INDEX  # (B, T)
        next_tokens = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX  # (B, T)
                            ).masked_fill(padded, IGNORE_INDEX)
        previous_tokens = F.pad(labels[:, :-1], (1, 0), value=IGNORE_INDEX  # (B, T)
                                ).masked_fill(padded, IGNORE_INDEX)
        parts, metrics, total = [], {}, 0
        for direction, states, targets in (("forward", hidden[..., :width], next_tokens),
                                           ("backward", hidden[..., width:], previous_tokens)):
            count = int((targets != IGNORE_INDEX).sum())
            loss, correct = projected_cross_entropy(states, decoder, targets)
            parts.append(loss)
            total += count
            value = float(loss.detach())
            metrics[f"bilm_{direction}_loss"] = value
            metrics[f"bilm_{direction}_perplexity"] = math.exp(min(value, 50.0))
            metrics[f"bilm_{direction}_accuracy"] = float(correct) / max(count, 1)
        loss = (parts[0] + parts[1]) / 2
        value = float(loss.detach())
        metrics.update(bilm_loss=value, bilm_perplexity=math.exp(min(value, 50.0)))
        return ObjectiveResult(loss, metrics, total // 2)
