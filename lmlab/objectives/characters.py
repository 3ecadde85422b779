"""CANINE-C (Clark et al. 2022, §3.2.1), the autoregressive character loss: whitespace-bounded
spans of characters become [MASK] codepoints (no random replacement: there is no vocabulary to
draw from); a one-layer causal Transformer then predicts the masked characters one at a time in
a shuffled order, each step from the model's final state at the character it predicts and the
embedding of the character revealed one step before; targets are codepoints mod 16,000
buckets. The predictor is the objective's, dropped after pretraining (docs/objectives.md)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from lmlab.models.config import TransformerConfig
from lmlab.models.core.activations import activation
from lmlab.models.core.layer import TransformerLayer
from lmlab.models.core.masks import build_attention_mask
from lmlab.models.heads import token_cross_entropy
from lmlab.models.model import init_normal
from lmlab.objectives.base import Objective, ObjectiveResult, accuracy, require_labels
from lmlab.objectives.masking import IGNORE_INDEX, candidate_mask, check_rate, choose_whole_words
from lmlab.objectives.special_tokens import SpecialTokens
from lmlab.utils.checks import check_at_least
from lmlab.utils.errors import LmlabError

#: every whitespace codepoint (str.isspace; none lies above U+3000): the span boundaries
WHITESPACE = np.array([i for i in range(0x3001) if chr(i).isspace()], dtype=np.int64)


class CharacterPredictor(nn.Module):
    """``[state ; previous character's embedding]`` -> dense (2H -> H), activation, LayerNorm
    -> one post-norm core layer under a causal mask -> ``buckets`` logits. ``start`` stands in
    for the character before the first step."""

    def __init__(self, config: TransformerConfig, buckets: int):
        super().__init__()
        hidden = config.hidden_size
        self.start = nn.Parameter(torch.empty(hidden))
        self.project = nn.Linear(2 * hidden, hidden)
        self.act = activation(config.hidden_act)
        self.norm = nn.LayerNorm(hidden, eps=config.norm_eps)
        self.layer = TransformerLayer(config)
        self.output = nn.Linear(hidden, buckets)
        self.apply(lambda module: init_normal(module, config.initializer_range))
        nn.init.normal_(self.start, std=config.initializer_range)

    def forward(self, states: torch.Tensor, previous: torch.Tensor,
                steps: torch.Tensor) -> torch.Tensor:
        """(B, P, H) states and previous-character embeddings, (B, P) real steps -> (B, P, V)."""
        x = self.norm(self.act(self.project(torch.cat([states, previous], dim=-1))))
        mask, is_causal = build_attention_mask(steps.long(), x.shape[1], x.shape[1], True,
                                               x.device)
        return self.output(self.layer(x, mask=mask, is_causal=is_causal)[0])


class AutoregressiveCharacters(Objective):
    """CANINE-C. Arguments: the share of (non-space) characters predicted ``mask_prob``, the
    ``buckets`` the codepoints are hashed into (the paper's 16,000) and the weight in a
    combination; masking is dynamic. Needs a CANINE model: its own hash embeddings embed the
    gold characters."""

    name = "canine-c"
    corrupts_tokens = True
    salt = 11
    flops_head = "none"  # the predictor is one layer over the ~15% predicted characters
    reports_perplexity = False  # a loss over hashed buckets, not over characters
    cls_sep_packing = True
    shown = ("mask_prob", "buckets")

    def __init__(self, special: SpecialTokens, mask_prob: float = 0.15, buckets: int = 16000,
                 weight: float = 1.0):
        super().__init__(special, weight)
        special.require_mask()
        self.mask_prob = check_rate(mask_prob)
        check_at_least(buckets, 2, "buckets")
        self.buckets = int(buckets)
        self._special_ids = np.asarray(special.special_ids, dtype=np.int64)
        self.predictor: CharacterPredictor | None = None

    @property
    def predicted_fraction(self) -> float | None:
        return self.mask_prob

    def prepare(self, model: nn.Module) -> None:
        """Build the predictor at the model's width (a CANINE model's: its hash embeddings
        embed the gold characters)."""
        embeddings = getattr(getattr(model, "transformer", None), "embeddings", None)
        if not hasattr(embeddings, "codepoint_vectors"):
            raise LmlabError(f"the {self.name!r} objective embeds characters with CANINE's hash "
                             f"embeddings, and this is a {model.config.family} model",
                             "pretrain --family canine with it (or pick the family's objective)")
        if self.predictor is None:
            predictor = CharacterPredictor(model.config, self.buckets)
            self.predictor = predictor.to(next(model.parameters()).device)

    # -- corruption ---------------------------------------------------------------------------
    def corrupt(self, batch: dict[str, torch.Tensor],
                rng: torch.Generator) -> dict[str, torch.Tensor]:
        """``input_ids`` with whole words masked; ``labels`` (B, T): their codepoints, -100
        elsewhere; ``order`` (B, P): the masked positions in each row's shuffled prediction
        order, padded with -1."""
        ids = batch["input_ids"].numpy()
        attention = (batch["attention_mask"].numpy() if "attention_mask" in batch
                     else ids != self.special.pad_id)
        candidates = candidate_mask(ids, attention, self._special_ids) & ~np.isin(ids, WHITESPACE)
        starts = batch["word_starts"].numpy() if "word_starts" in batch else np.zeros_like(ids)
        corrupted, labels = ids.astype(np.int64), np.full(ids.shape, IGNORE_INDEX, np.int64)
        orders = []
        for row, gen in enumerate(self.row_generators(batch, rng)):
            chosen = choose_whole_words(candidates[row], starts[row], self.mask_prob, gen)
            labels[row, chosen] = ids[row, chosen]
            corrupted[row, chosen] = self.special.mask_id
            orders.append(gen.permutation(np.flatnonzero(chosen)))
        order = np.full((len(orders), max(1, max(map(len, orders), default=0))), -1, np.int64)
        for row, positions in enumerate(orders):
            order[row, :len(positions)] = positions
        return dict(batch, input_ids=torch.from_numpy(corrupted), labels=torch.from_numpy(labels),
                    order=torch.from_numpy(order))

    # -- loss ---------------------------------------------------------------------------------
    def losses(self, model: nn.Module, batch: dict[str, torch.Tensor], hidden: torch.Tensor,
               pooled: torch.Tensor | None) -> ObjectiveResult:
        labels = require_labels(batch, self.name)
        if "order" not in batch or self.predictor is None:
            raise LmlabError("the batch has no prediction 'order' or the objective was not "
                             "prepared", "corrupt batches with this objective's corrupt() and "
                             "call objective.prepare(model) first")
        order = batch["order"]  # (B, P)
        steps = order >= 0
        count = int(steps.sum())
        where = order.clamp(min=0)
        states = hidden.gather(1, where[..., None].expand(-1, -1, hidden.shape[-1]))  # (B, P, H)
        gold = labels.gather(1, where)  # (B, P) codepoints (junk on padded steps)
        gold = torch.where(steps, gold, torch.zeros_like(gold))
        embedded = model.transformer.embeddings.codepoint_vectors(gold)  # (B, P, H)
        start = self.predictor.start.expand(gold.shape[0], 1, -1)
        previous = torch.cat([start, embedded[:, :-1]], dim=1)  # step k sees character k - 1
        logits = self.predictor(states, previous, steps)  # (B, P, buckets)
        targets = torch.where(steps, gold % self.buckets, torch.full_like(gold, IGNORE_INDEX))
        if count == 0:
            return ObjectiveResult(logits.sum() * 0.0, {"char_loss": 0.0, "char_accuracy": 0.0})
        loss = token_cross_entropy(logits[steps], targets[steps])
        return ObjectiveResult(loss, {"char_loss": float(loss.detach()),
                                      "char_accuracy": accuracy(logits[steps], targets[steps])},
                               count)
