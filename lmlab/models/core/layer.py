"""One Transformer layer, post-norm (BERT: ``norm(x + f(x))``) or pre-norm (``x + f(norm(x))``)."""

from __future__ import annotations

import torch
from torch import nn

from lmlab.models.config import TransformerConfig
from lmlab.models.core.attention import Attention
from lmlab.models.core.cache import KVCache
from lmlab.models.core.feedforward import FeedForward
from lmlab.models.core.local_attention import WindowInputs
from lmlab.models.core.norms import make_norm
from lmlab.models.core.unpad import PaddingIndex


class TransformerLayer(nn.Module):
    def __init__(self, config: TransformerConfig, window: int = 0):
        super().__init__()
        self.pre_norm = config.pre_norm
        norm = lambda: make_norm(config.norm_type, config.hidden_size, config.norm_eps)  # noqa: E731
        self.attention = Attention(config, window=window)
        self.attention_norm = norm()
        self.cross_attention = Attention(config, cross=True) if config.add_cross_attention else None
        self.cross_attention_norm = norm() if config.add_cross_attention else None
        self.feed_forward = FeedForward(config)
        self.ffn_norm = norm()
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def _sublayer(self, x: torch.Tensor, norm: nn.Module, fn) -> tuple[torch.Tensor, object]:
        if self.pre_norm:
            out, extra = fn(norm(x))
            return x + self.dropout(out), extra
        out, extra = fn(x)
        return norm(x + self.dropout(out)), extra

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
        rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
        cache: KVCache | None = None,
        layer_index: int = 0,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_mask: torch.Tensor | None = None,
        cross_cache: KVCache | None = None,
        output_attentions: bool = False,
        padding: PaddingIndex | None = None,
        relative: tuple[torch.Tensor, torch.Tensor] | None = None,
        window_inputs: WindowInputs | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Returns (hidden (B, T, H), self-attention probs or None, cross-attention probs or None)."""
        x, self_probs = self._sublayer(x, self.attention_norm, lambda h: self.attention(
            h, mask=mask, is_causal=is_causal, rotary=rotary, cache=cache,
            layer_index=layer_index, output_attentions=output_attentions, padding=padding,
            relative=relative, window_inputs=window_inputs))
        cross_probs = None
        if self.cross_attention is not None and encoder_hidden_states is not None:
            x, cross_probs = self._sublayer(x, self.cross_attention_norm,
                                            lambda h: self.cross_attention(
                h, mask=encoder_mask, cache=cross_cache, layer_index=layer_index,
                key_value_states=encoder_hidden_states, output_attentions=output_attentions))
        x, _ = self._sublayer(x, self.ffn_norm, lambda h: (self.feed_forward(h), None))
        return x, self_probs, cross_probs
