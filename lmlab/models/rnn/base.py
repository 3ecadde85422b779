"""What AWD-LSTM and ELMo share: named heads and the forward interface of lmlab's models.

A recurrent model is not a Transformer, but it answers the calls the rest of lmlab makes of a
:class:`~lmlab.models.model.LanguageModel`, so the one Trainer, the pretraining objectives, the
fine-tuning runner and feature extraction take it unchanged:

* ``model(input_ids, attention_mask, heads=[...], output_hidden_states=True)`` ->
  :class:`~lmlab.models.outputs.ModelOutput` with ``last_hidden_state`` (B, T, H) and
  ``hidden_states`` (the token representation, then every layer: L + 1 tensors);
* ``model.heads`` (a ModuleDict), ``add_head(name)`` and ``run_head(...)``: the family's LM head
  (``"clm"`` for AWD-LSTM, ``"bilm"`` for ELMo) and lmlab's task heads
  (:mod:`lmlab.models.task_heads`: sequence classification with ULMFiT's concat pooling, tagging);
* ``model.config`` (a :class:`~lmlab.models.rnn.config.RecurrentConfig`), ``model.pooler``
  (None: no [CLS] pooler), ``layer_groups()`` (ULMFiT's discriminative rates and gradual
  unfreezing).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from lmlab.models.heads import IGNORE_INDEX
from lmlab.models.outputs import ModelOutput
from lmlab.models.rnn.config import RecurrentConfig
from lmlab.utils.errors import LmlabError


class LMHead(nn.Module):
    """The vocabulary projection of a recurrent LM, with a bias as in Merity et al.'s and Peters
    et al.'s softmax (AWD-LSTM ties the weight to the embeddings). The bias carries the unigram
    distribution: without it a tied AWD-LSTM, whose outputs are bounded by tanh and whose
    embeddings start at +-0.1, stayed on the unigram plateau for 1,000 steps (docs/recurrent.md).
    ``loss`` is next-token cross-entropy, as :class:`~lmlab.models.heads.CausalLMHead`'s."""

    def __init__(self, width: int, vocab_size: int):
        super().__init__()
        self.decoder = nn.Linear(width, vocab_size)
        nn.init.zeros_(self.decoder.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder(hidden)  # (B, T, V)

    @staticmethod
    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        shifted = logits[:, :-1].reshape(-1, logits.shape[-1]).float()  # (B*(T-1), V)
        return F.cross_entropy(shifted, labels[:, 1:].reshape(-1), ignore_index=IGNORE_INDEX)


class RecurrentModel(nn.Module):
    """Base class: heads and the forward frame; subclasses define
    :meth:`encode` (the hidden states), :meth:`layer_groups` and their LM head's name."""

    lm_head = ""  # the family's language-model head ("clm", "bilm")

    def __init__(self, config: RecurrentConfig):
        super().__init__()
        self.config = config
        self.pooler = None  # no [CLS] pooler: classifiers pool over tokens
        self.heads = nn.ModuleDict()

    # -- heads -----------------------------------------------------------------------------------
    def _new_head(self, name: str) -> nn.Module:
        from lmlab.models.heads import build_head
        from lmlab.models.model import init_normal
        from lmlab.models.task_heads import TASK_HEADS

        if name == self.lm_head:
            return LMHead(self.lm_width(), self.config.vocab_size)
        if name in TASK_HEADS:
            head = build_head(name, self.config)
            head.apply(lambda module: init_normal(module, 0.02))
            return head
        raise LmlabError(f"a {self.config.family} model has no {name!r} head",
                         f"its language-model head is {self.lm_head!r} (--objective "
                         f"{self.lm_head}); task heads: {', '.join(TASK_HEADS)}")

    def add_head(self, name: str) -> nn.Module:
        """Add a head by name (the LM head or a task head) when missing; returns it."""
        if name not in self.heads:
            self.heads[name] = self._new_head(name)
            self.tie_weights()
        return self.heads[name]

    def lm_width(self) -> int:
        """Width of the vectors the LM head reads."""
        return self.config.hidden_size

    def tie_weights(self) -> None:
        """Share matrices between the input and the LM head where the family does."""

    def run_head(self, name: str, hidden: torch.Tensor, pooled: torch.Tensor | None,
                 attention_mask: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor:
        """Logits of head ``name`` from the last hidden states (task heads pool them)."""
        head = self.heads[name]
        if getattr(head, "takes_attention_mask", False):
            kwargs["attention_mask"] = attention_mask
        if getattr(head, "takes_hidden", False):
            return head(hidden, pooled=pooled, **kwargs)
        return head(hidden, **kwargs)

    def num_parameters(self, trainable_only: bool = False) -> int:
        from lmlab.models.model import count_parameters

        return count_parameters(self, trainable_only)

    # -- forward ---------------------------------------------------------------------------------
    def encode(self, input_ids: torch.Tensor,
               attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(last hidden state (B, T, H) as the heads read it, every hidden state (L + 1))."""
        raise NotImplementedError

    def forward(self, input_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, output_hidden_states: bool = False,
                heads: Sequence[str] | None = None, inputs_embeds: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, output_attentions: bool = False,
                use_cache: bool = False, skip_padding: bool = True) -> ModelOutput:
        """Run the recurrent stack and the heads (all, or those named in ``heads``).

        ``token_type_ids`` and ``position_ids`` are ignored (a recurrent model has no segment or
        position table); ``attention_mask`` (B, T) marks right padding. With ``labels`` the
        loss is the primary head's.
        """
        if input_ids is None or inputs_embeds is not None:
            raise LmlabError(f"a {self.config.family} model reads token ids (input_ids), not "
                             "embeddings", "pass input_ids")
        if output_attentions:
            raise LmlabError(f"a {self.config.family} model has no attention to return",
                             "drop output_attentions")
        if attention_mask is not None and attention_mask.dim() != 2:
            raise LmlabError(f"a recurrent model takes a (B, T) padding mask, not "
                             f"{tuple(attention_mask.shape)}", "pass the 2-D attention_mask")
        last, states = self.encode(input_ids, attention_mask)
        names = list(self.heads.keys()) if heads is None else list(heads)
        head_logits = {name: self.run_head(name, last, None, attention_mask) for name in names}
        logits = head_logits[names[0]] if names else None
        loss = None
        if labels is not None:
            if not names:
                raise LmlabError("labels were given but the model has no head to train",
                                 "add a head first (model.add_head(name))")
            head = self.heads[names[0]]
            loss = (head.loss(logits, labels, attention_mask)
                    if getattr(head, "loss_takes_attention_mask", False)
                    else head.loss(logits, labels))
        return ModelOutput(last_hidden_state=last, logits=logits, loss=loss,
                           hidden_states=tuple(states) if output_hidden_states else None,
                           head_logits=head_logits)

    # -- fine-tuning -----------------------------------------------------------------------------
    def layer_groups(self) -> list[list[nn.Module]]:
        """Modules from the top (the heads) down to the token representation: ULMFiT's layer
        groups (:func:`lmlab.finetune.recipes.layer_groups`)."""
        raise NotImplementedError


def lengths_of(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """(B,) real tokens per row (right padding), every position when there is no mask."""
    if attention_mask is None:
        return torch.full((input_ids.shape[0],), input_ids.shape[1], dtype=torch.long,
                          device=input_ids.device)
    return attention_mask.long().sum(1)
