"""Multi-head / grouped-query attention, self or cross, written once for every family: the fused
SDPA path by default, the math path when probabilities are requested (``output_attentions``),
the blocked sliding-window path for a layer with an attention window, BigBird's block-sparse
path for a long enough input.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from lmlab.models.config import TransformerConfig
from lmlab.models.core.block_sparse import block_sparse_attention, sparse_applies
from lmlab.models.core.cache import KVCache
from lmlab.models.core.disentangled import DisentangledBias
from lmlab.models.core.local_attention import (
    WindowInputs,
    global_rows,
    local_attention,
    window_mask,
)
from lmlab.models.core.masks import additive_mask, causal_mask
from lmlab.models.core.positions import apply_rotary
from lmlab.models.core.unpad import PaddingIndex


class Attention(nn.Module):
    """Self- or cross-attention with ``q_proj``, ``k_proj``, ``v_proj`` and ``o_proj``."""

    def __init__(self, config: TransformerConfig, cross: bool = False, window: int = 0):
        super().__init__()
        self.window = 0 if cross else window  # keys seen per query (0: all)
        self.block_sparse = None if cross else config.block_sparse  # BigBird's pattern
        self.causal = config.causal
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.cross = cross
        bias = config.attention_bias
        hidden = config.hidden_size
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=bias)
        key_bias = bias and config.extra.get("key_bias", True)  # DeBERTa v1: keys unbiased
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=key_bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        out_bias = bias if config.attention_out_bias is None else config.attention_out_bias
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=out_bias)
        self.dropout_p = config.attention_probs_dropout_prob
        terms = 1 + len(config.pos_att_type or ())  # DeBERTa scales by its score terms
        self.scale = (config.attention_scale if config.attention_scale is not None
                      else 1.0 / math.sqrt(self.head_dim * terms))
        self.disentangled = DisentangledBias(config) if config.relative_attention else None
        self.global_proj = None  # Longformer: the global tokens' own q, k, v maps
        if self.window and config.extra.get("global_projections"):
            self.global_proj = nn.ModuleList(
                nn.Linear(hidden, self.num_heads * self.head_dim, bias=bias) for _ in "qkv")

    def _split_heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, heads, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)

    def _share_kv_heads(self, k: torch.Tensor, v: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """Grouped-query attention: repeat each key/value head for its group of query heads."""
        if self.num_kv_heads == self.num_heads:
            return k, v
        repeat = self.num_heads // self.num_kv_heads
        return k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)  # (B, nh, Tk, hd)

    def forward(
        self,
        hidden_states: torch.Tensor,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
        rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
        cache: KVCache | None = None,
        layer_index: int = 0,
        key_value_states: torch.Tensor | None = None,
        output_attentions: bool = False,
        padding: PaddingIndex | None = None,
        relative: tuple[torch.Tensor, torch.Tensor] | None = None,
        window_inputs: WindowInputs | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend; returns (output (B, T, H), probabilities (B, nh, Tq, Tk) or None). With
        ``padding``, ``hidden_states`` and the output are the real tokens only (N, H);
        ``relative``: DeBERTa's distance table and index (:mod:`~lmlab.models.core.disentangled`);
        ``window_inputs``: real and global tokens for a windowed layer."""
        if padding is not None:
            batch, q_len = padding.batch, padding.length
            layout = padding.pad  # (N, D) -> (B, T, D), zeros at padding positions
        else:
            batch, q_len = hidden_states.shape[:2]
            layout = _unchanged
        source = hidden_states if key_value_states is None else key_value_states
        q = self._split_heads(layout(self.q_proj(hidden_states)), self.num_heads)  # (B, nh, Tq, hd)

        if self.cross and cache is not None and cache.seq_len(layer_index) > 0:
            k, v = cache.keys[layer_index], cache.values[layer_index]  # encoder keys, computed once
        else:
            k = self._split_heads(layout(self.k_proj(source)), self.num_kv_heads)  # (B, nkv, Tk, hd)
            v = self._split_heads(layout(self.v_proj(source)), self.num_kv_heads)
            if rotary is not None:
                cos, sin = rotary
                q = apply_rotary(q, cos, sin)
                k = apply_rotary(k, cos, sin)
            if cache is not None:
                k, v = cache.update(layer_index, k, v)

        k, v = self._share_kv_heads(k, v)
        if self.disentangled is not None and relative is not None:  # joined with the mask
            bias = self.disentangled(q, k, *relative, self.q_proj, self.k_proj)
            mask, is_causal = additive_mask(bias, mask, is_causal, q.dtype), False

        dropout_p = self.dropout_p if self.training else 0.0
        sparse = window_inputs is not None and window_inputs.blocked and cache is None
        if self.block_sparse and sparse and sparse_applies(q_len, **self.block_sparse):
            context, probs = block_sparse_attention(  # random blocks fixed per layer in training
                q, k, v, window_inputs.keys, **self.block_sparse, scale=self.scale,
                dropout_p=dropout_p, seed=layer_index if self.training else None,
                probabilities=output_attentions)
            return self._output(context, batch, q_len, padding), probs
        probs = global_qkv = None
        if self.window:
            inputs = window_inputs or WindowInputs(blocked=False)
            if self.global_proj is not None and inputs.global_tokens is not None:
                global_qkv = [self._split_heads(layout(proj(hidden_states)), self.num_heads)
                              for proj in self.global_proj]  # 3 x (B, nh, T, hd)
            if inputs.blocked and cache is None and not output_attentions:
                context = local_attention(q, k, v, self.window, self.causal, inputs, self.scale,
                                          dropout_p, global_qkv)
                return self._output(context, batch, q_len, padding), None
            mask = window_mask(self.window, self.causal, mask, is_causal, q.shape[2], k.shape[2],
                               inputs, q.device)
            is_causal = False
        if output_attentions:
            scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale  # (B, nh, Tq, Tk)
            if is_causal:
                causal = causal_mask(*scores.shape[-2:], q.device)  # (Tq, Tk)
                scores = scores.masked_fill(~causal, torch.finfo(scores.dtype).min)
            if mask is not None and mask.dtype == torch.bool:
                scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
            elif mask is not None:  # additive (T5's position bias, -inf where hidden)
                scores = scores + mask
            probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
            context = torch.matmul(F.dropout(probs, dropout_p, self.training), v)
        else:
            context = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal,
                scale=self.scale,
            )
        if global_qkv is not None:  # the global rows from their own maps (no cache: encoders)
            context = global_rows(context, *global_qkv, inputs, self.causal, self.scale, dropout_p)
        return self._output(context, batch, q_len, padding), probs

    def _output(self, context: torch.Tensor, batch: int, q_len: int,
                padding: PaddingIndex | None) -> torch.Tensor:
        """The heads' context (B, nh, Tq, hd) joined and projected: (B, Tq, H) or (N, H)."""
        context = context.transpose(1, 2).reshape(batch, q_len, self.num_heads * self.head_dim)
        if padding is not None:
            context = padding.unpad(context)  # (N, nh*hd): real tokens only
        return self.o_proj(context)


def _unchanged(x: torch.Tensor) -> torch.Tensor:
    return x
