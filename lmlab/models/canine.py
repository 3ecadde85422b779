"""CANINE (Clark et al. 2022): a tokenizer-free encoder over Unicode codepoints. Hashed
character embeddings, one core layer attending in blocks of characters, a strided convolution
down to molecules, the deep post-norm core stack over them, the molecules repeated back to
characters and convolved with the first encoding, one more core layer (docs/characters.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from lmlab.models.config import TransformerConfig
from lmlab.models.core.characters import (
    CharactersToMolecules,
    ConvProjection,
    HashEmbeddings,
    canine_settings,
    local_layer,
    repeat_molecules,
)
from lmlab.models.core.layer import TransformerLayer
from lmlab.models.core.masks import build_attention_mask
from lmlab.models.heads import Pooler, build_head, needs_pooler
from lmlab.models.model import HeadedModel, init_normal
from lmlab.models.outputs import ModelOutput
from lmlab.utils.errors import LmlabError


class CanineTransformer(nn.Module):
    """The character stack: ``embeddings``, ``initial_layer`` (local), ``downsample``,
    ``layers`` (the deep stack over molecules), ``upsample``, ``final_layer``."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        self.settings = canine_settings(config)
        self.embeddings = HashEmbeddings(config)
        self.initial_layer = TransformerLayer(config)
        self.downsample = CharactersToMolecules(config)
        self.layers = nn.ModuleList(TransformerLayer(config)
                                    for _ in range(config.num_hidden_layers))
        self.upsample = ConvProjection(config)
        self.final_layer = TransformerLayer(config)

    def forward(self, input_ids: torch.Tensor | None = None, **kwargs: Any) -> ModelOutput:
        """The characters' last hidden state (B, T, H) (:meth:`encode`)."""
        return self.encode(input_ids, **kwargs)[0]

    def encode(self, input_ids: torch.Tensor | None = None,
               attention_mask: torch.Tensor | None = None,
               token_type_ids: torch.Tensor | None = None,
               position_ids: torch.Tensor | None = None,
               inputs_embeds: torch.Tensor | None = None,
               output_hidden_states: bool = False, output_attentions: bool = False,
               **ignored: Any) -> tuple[ModelOutput, torch.Tensor]:
        """(the output, the deep stack's molecules (B, T // rate, H)). Hidden states and
        attentions on request: the initial layer's, the deep stack's and the final layer's in
        turn, as transformers lists them. ``ignored``: settings of other stacks (a cache,
        ``skip_padding``: every position is computed, padding feeds the convolutions)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise LmlabError("pass exactly one of input_ids and inputs_embeds",
                             "CANINE reads codepoints as input_ids (CharacterTokenizer)")
        x = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)
        batch, length = x.shape[:2]
        rate = self.settings["downsampling_rate"]
        if length < rate:
            raise LmlabError(f"{length} characters are fewer than the downsampling rate {rate}",
                             f"pad the batch to at least {rate} characters")
        if attention_mask is None:
            attention_mask = torch.ones(batch, length, dtype=torch.long, device=x.device)
        states = [x] if output_hidden_states else None
        probs = [] if output_attentions else None

        def record(hidden: torch.Tensor, attention: torch.Tensor | None) -> torch.Tensor:
            if states is not None:
                states.append(hidden)
            if probs is not None:
                probs.append(attention)
            return hidden

        chars = record(*local_layer(self.initial_layer, x, attention_mask,
                                    self.settings["local_transformer_stride"],
                                    output_attentions))
        molecules = self.downsample(chars)  # (B, M, H)
        if states is not None:
            states.append(molecules)
        pooled_mask = F.max_pool1d(attention_mask[:, None].float(), rate, rate)[:, 0]  # (B, M)
        mask, _ = build_attention_mask(pooled_mask, molecules.shape[1], molecules.shape[1],
                                       False, x.device)
        for layer in self.layers:
            molecules = record(*layer(molecules, mask=mask,
                                      output_attentions=output_attentions)[:2])
        joined = torch.cat([chars, repeat_molecules(molecules, length, rate)], dim=-1)  # (B, T, 2H)
        x = self.upsample(joined)
        if states is not None:
            states.append(x)
        mask, _ = build_attention_mask(attention_mask, length, length, False, x.device)
        x = record(*self.final_layer(x, mask=mask, output_attentions=output_attentions)[:2])
        return ModelOutput(last_hidden_state=x,
                           hidden_states=tuple(states) if states is not None else None,
                           attentions=tuple(probs) if probs is not None else None), molecules


class CanineModel(HeadedModel):
    """``transformer`` (:class:`CanineTransformer`) + optional ``pooler`` (over the deep
    stack's [CLS] molecule, as transformers') + ``heads`` (on the characters or the pooled
    vector); the interface of :class:`~lmlab.models.model.LanguageModel`."""

    def __init__(self, config: TransformerConfig, heads: Sequence[str] = (),
                 with_pooler: bool | None = None):
        super().__init__()
        self.config = config
        self.transformer = CanineTransformer(config)
        pooled = any(needs_pooler(name) for name in heads)
        self.pooler = Pooler(config) if (with_pooler or pooled) else None
        self.heads = nn.ModuleDict({name: build_head(name, config) for name in heads})
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        init_normal(module, self.config.initializer_range)
        if isinstance(module, nn.Conv1d):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
            nn.init.zeros_(module.bias)

    def get_input_embeddings(self) -> None:
        """None: codepoints are hashed, there is no token table to share."""
        return None

    def layer_groups(self) -> list[list[nn.Module]]:
        """Modules from the top, for layer-wise learning rates: heads, pooler and the final
        character layer with the upsampling; each deep layer; the downsampling with the
        initial layer; the embeddings."""
        stack = self.transformer
        top = [*self.heads.values(), *([self.pooler] if self.pooler is not None else []),
               stack.final_layer, stack.upsample]
        return [top, *([layer] for layer in reversed(list(stack.layers))),
                [stack.downsample, stack.initial_layer], [stack.embeddings]]

    def _new_head(self, name: str) -> nn.Module:
        head = super()._new_head(name)
        if needs_pooler(name) and self.pooler is None:
            self.pooler = Pooler(self.config)
            self.pooler.apply(self._init_weights)
        return head

    def forward(self, input_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None,
                labels: torch.Tensor | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False,
                heads: Sequence[str] | None = None, **ignored: Any) -> ModelOutput:
        """Run the stack, the pooler and the heads (all, or those named in ``heads``);
        ``loss`` of the primary head on ``labels``."""
        out, molecules = self.transformer.encode(
            input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
            position_ids=position_ids, inputs_embeds=inputs_embeds,
            output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        hidden = out.last_hidden_state
        pooled = self.pooler(molecules) if self.pooler is not None else None
        head_logits, logits, loss = self.run_heads(heads, hidden, pooled, attention_mask, labels)
        return ModelOutput(last_hidden_state=hidden, logits=logits, loss=loss,
                           pooler_output=pooled, hidden_states=out.hidden_states,
                           attentions=out.attentions, head_logits=head_logits)
