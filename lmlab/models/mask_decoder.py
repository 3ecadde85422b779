"""DeBERTa's enhanced mask decoder (He et al. 2021, Section 3.2): absolute positions enter just
before the masked-LM head. As microsoft/DeBERTa's code does, the stack's last layer runs again
``n`` times (2; ``extra["emd_layers"]``) with queries ``I`` = (the last layer's input H + the
absolute positions P), then each step's output, over keys and values from H; the MLM head reads
the last step. Only P is new: the layer is the stack's own (docs/deberta.md).
"""

from __future__ import annotations

import torch
from torch import nn

from lmlab.models.config import TransformerConfig
from lmlab.models.core.masks import build_attention_mask
from lmlab.models.heads import MaskedLMHead
from lmlab.utils.errors import LmlabError


class EnhancedMaskDecoderHead(MaskedLMHead):
    """The ``"emd"`` head: :class:`MaskedLMHead` over the decoder's states. It reads the last
    layer's *input* (``hidden_states[-2]``) and the stack (``LanguageModel`` passes both)."""

    takes_attention_mask = True
    reruns_last_layer = True

    def __init__(self, config: TransformerConfig):
        super().__init__(config)
        if config.pre_norm or config.position_embedding != "none" or not config.relative_attention:
            raise LmlabError("the enhanced mask decoder is DeBERTa's: a post-norm stack with "
                             "relative attention and no absolute positions at the input",
                             "use it on a deberta-v2 or deberta model with "
                             "position_biased_input false (v3's presets)")
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.steps = int(config.extra.get("emd_layers", 2))

    def decode(self, layer_input: torch.Tensor, stack: nn.Module,
               attention_mask: torch.Tensor | None = None,
               position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The decoder's output (B, T, H) from the last layer's input ``layer_input`` (B, T, H)."""
        batch, length = layer_input.shape[:2]
        layer = stack.layer(stack.config.num_hidden_layers - 1)
        mask, _ = build_attention_mask(attention_mask, length, length, False, layer_input.device)
        relative = stack.relative_positions(length, length, layer_input.device)
        if position_ids is None:
            position_ids = torch.arange(length, device=layer_input.device).expand(batch, length)
        query = layer_input + self.position_embeddings(position_ids)  # I = H + P
        for _ in range(self.steps):  # post-norm: the residual is the query
            attended, _ = layer.attention(query, mask=mask, key_value_states=layer_input,
                                          relative=relative)
            query = layer.attention_norm(query + layer.dropout(attended))
            query = layer.ffn_norm(query + layer.dropout(layer.feed_forward(query)))
        return query

    def forward(self, layer_input: torch.Tensor | None, stack: nn.Module | None = None,
                attention_mask: torch.Tensor | None = None,
                positions: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, V), or (N, V) for the ``positions`` boolean mask (B, T)."""
        if stack is None or layer_input is None:
            raise LmlabError("the enhanced mask decoder reruns the stack's last layer",
                             "run it through the model (model(..., heads=['emd'])) or pass "
                             "stack=model.transformer and hidden_states[-2]")
        return super().forward(self.decode(layer_input, stack, attention_mask, position_ids),
                               positions)
