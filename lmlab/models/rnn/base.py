"""What AWD-LSTM and ELMo share: named heads and the forward interface of lmlab's models, so the
Trainer, objectives, fine-tuning and feature extraction take them as they take a
:class:`~lmlab.models.model.LanguageModel` (docs/recurrent.md, "How it plugs in").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from lmlab.models.heads import IGNORE_INDEX, build_head
from lmlab.models.model import HeadedModel, init_normal
from lmlab.models.outputs import ModelOutput
from lmlab.models.rnn.config import RecurrentConfig
from lmlab.utils.errors import LmlabError


class LMHead(nn.Module):
    """The vocabulary projection of a recurrent LM, with a bias (the unigram distribution) as in
    Merity et al.'s and Peters et al.'s softmax; ``loss`` is next-token cross-entropy."""

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


class RecurrentModel(HeadedModel):
    """Base class: heads and the forward frame; subclasses define
    :meth:`encode` (the hidden states), :meth:`layer_groups` and their LM head's name."""

    family = ""  # the config family the class builds ("awd-lstm", "elmo")
    lm_head = ""  # the family's language-model head ("clm", "bilm")

    def __init__(self, config: RecurrentConfig):
        if config.family != self.family:
            raise LmlabError(f"{type(self).__name__} needs a config of family {self.family!r}, "
                             f"not {config.family!r}",
                             "build the model with lmlab.interop.recurrent.build_model(config)")
        super().__init__()
        self.config = config
        self.pooler = None  # no [CLS] pooler: classifiers pool over tokens
        self.heads = nn.ModuleDict()

    # -- heads -----------------------------------------------------------------------------------
    def _new_head(self, name: str) -> nn.Module:
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

    def lm_width(self) -> int:
        """Width of the vectors the LM head reads."""
        return self.config.hidden_size

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
        """Run the recurrent stack and the heads (all, or those named in ``heads``);
        ``token_type_ids`` and ``position_ids`` are ignored, ``attention_mask`` marks right
        padding."""
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
        head_logits, logits, loss = self.run_heads(heads, last, None, attention_mask, labels)
        return ModelOutput(last_hidden_state=last, logits=logits, loss=loss,
                           hidden_states=tuple(states) if output_hidden_states else None,
                           head_logits=head_logits)

    # -- fine-tuning -----------------------------------------------------------------------------
    def layer_groups(self) -> list[list[nn.Module]]:
        """Modules from the top (the heads) down to the token representation: ULMFiT's layer
        groups (:func:`lmlab.finetune.recipes.layer_groups`)."""
        raise NotImplementedError
