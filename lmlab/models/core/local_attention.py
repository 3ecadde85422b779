"""Sliding-window (local) attention with global tokens (Longformer; GPT-Neo's local layers):
each query sees the keys within its window, global tokens see and are seen by every token.
Computed in blocks of the window, so memory grows linearly with the length: the (T, T) scores
are never built (docs/long-attention.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from lmlab.models.core.masks import causal_mask, open_empty_rows


@dataclass
class WindowInputs:
    """What a windowed (or BigBird's block-sparse) layer reads besides q, k, v: which keys are
    real tokens and which are global ((B, Tk) bool each, None: all real / none global);
    ``blocked``: the blocked path may run (no cache, no explicit 3-D mask)."""

    keys: torch.Tensor | None = None
    global_tokens: torch.Tensor | None = None
    blocked: bool = True


def window_reach(window: int, causal: bool) -> tuple[int, int]:
    """Keys seen (before, after) a query: causal ``window`` keys ending at the query itself
    (GPT-Neo's ``window_size``), else ``window // 2`` on each side (Longformer's)."""
    return (window - 1, 0) if causal else (window // 2, window // 2)


def window_mask(window: int, causal: bool, mask: torch.Tensor | None, is_causal: bool,
                q_len: int, k_len: int, inputs: WindowInputs, device: torch.device
                ) -> torch.Tensor:
    """The dense (B or 1, 1, Tq, Tk) mask equal to the blocked path: the band, global rows and
    columns, joined with ``mask``/``is_causal`` (used with a cache or when probabilities are
    asked for; Tq is small there)."""
    before, after = window_reach(window, causal)
    q_pos = torch.arange(q_len, device=device).unsqueeze(1) + (k_len - q_len)  # (Tq, 1)
    offset = torch.arange(k_len, device=device).unsqueeze(0) - q_pos  # (Tq, Tk): key - query
    visible = ((offset >= -before) & (offset <= after))[None, None]  # (1, 1, Tq, Tk)
    if inputs.global_tokens is not None:
        glob = inputs.global_tokens.bool()
        visible = visible | glob[:, None, None, :] | glob[:, None, -q_len:, None]
    if causal or is_causal:
        visible = visible & causal_mask(q_len, k_len, device)
    if mask is not None:
        visible = visible & mask
    return open_empty_rows(visible)


def local_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
                    causal: bool, inputs: WindowInputs, scale: float, dropout_p: float = 0.0,
                    global_qkv: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
    """Attention of q, k, v (B, nh, T, hd) inside the window, plus global tokens: the context
    (B, nh, T, hd). Queries go in blocks of the window's reach; each block's scores cover its
    keys only, (B, nh, T / b, b, b + reach) in all, and the global keys' columns (B, nh, T, G).
    ``global_qkv``: the global tokens' own q, k, v (B, nh, T, hd) for their rows (Longformer's
    ``query_global`` ...); default q, k, v."""
    batch, heads, length, dim = q.shape
    before, after = window_reach(window, causal)
    block = max(before, after, 1)
    blocks = -(-length // block)
    pad = blocks * block - length
    span = before + block + after
    real, glob = _tokens(inputs, q)

    # Each block's keys: the rows [b * block - before, (b + 1) * block + after) of padded k, v.
    frame = (0, 0, before, pad + after)
    keys = F.pad(k, frame).unfold(2, span, block)  # (B, nh, n, hd, span)
    values = F.pad(v, frame).unfold(2, span, block).transpose(-1, -2)  # (B, nh, n, span, hd)
    queries = F.pad(q, (0, 0, 0, pad)).view(batch, heads, blocks, block, dim)  # (B, nh, n, b, hd)
    scores = torch.matmul(queries, keys) * scale  # (B, nh, n, b, span)
    offset = torch.arange(span, device=q.device) - before - torch.arange(block, device=q.device)[:, None]
    band = (offset >= -before) & (offset <= after)  # (b, span): key - query inside the reach
    # global keys are seen through their own columns below, not twice
    seen = F.pad(real & ~glob, (before, pad + after)).unfold(1, span, block)  # (B, n, span)
    visible = band & seen[:, :, None, :]  # (B, n, b, span)

    count = int(glob.sum(1).max()) if inputs.global_tokens is not None else 0
    if count:
        order = glob.int().argsort(dim=1, descending=True, stable=True)[:, :count]  # (B, G)
        is_global = glob.gather(1, order) & real.gather(1, order)  # (B, G)
        index = order[:, None, :, None].expand(batch, heads, count, dim)  # (B, nh, G, hd)
        global_keys, global_values = k.gather(2, index), v.gather(2, index)  # (B, nh, G, hd)
        global_scores = torch.matmul(queries, global_keys[:, :, None].transpose(-1, -2)) * scale
        q_pos = torch.arange(blocks * block, device=q.device).view(blocks, block, 1)
        sees_global = is_global[:, None, None, :] & ~(causal & (order[:, None, None, :] > q_pos))
        scores = torch.cat([global_scores, scores], dim=-1)  # (B, nh, n, b, G + span)
        visible = torch.cat([sees_global, visible], dim=-1)
    scores = scores.masked_fill(~visible[:, None], torch.finfo(scores.dtype).min)
    upcast = torch.promote_types(scores.dtype, torch.float32)
    probs = F.dropout(torch.softmax(scores, dim=-1, dtype=upcast).to(q.dtype), dropout_p)
    context = torch.matmul(probs[..., count:], values)  # (B, nh, n, b, hd)
    if count:
        context = context + torch.matmul(probs[..., :count], global_values[:, :, None])
    context = context.view(batch, heads, blocks * block, dim)[:, :, :length]  # (B, nh, T, hd)
    return global_rows(context, *(global_qkv or (q, k, v)), inputs, causal, scale, dropout_p)


def global_rows(context: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                inputs: WindowInputs, causal: bool, scale: float, dropout_p: float = 0.0
                ) -> torch.Tensor:
    """``context`` (B, nh, T, hd) with the global tokens' rows replaced: their queries ``q``
    attend to every real (for a decoder, earlier) key of ``k``, ``v`` (B, nh, T, hd)."""
    if inputs.global_tokens is None:
        return context
    batch, heads, length, dim = q.shape
    real, glob = _tokens(inputs, q)
    count = int(glob.sum(1).max())
    if not count:
        return context
    order = glob.int().argsort(dim=1, descending=True, stable=True)[:, :count]  # (B, G)
    is_global = glob.gather(1, order) & real.gather(1, order)  # (B, G)
    index = order[:, None, :, None].expand(batch, heads, count, dim)  # (B, nh, G, hd)
    later = torch.arange(length, device=q.device) > order[..., None]  # (B, G, T)
    sees = real[:, None, :] & ~(causal & later)
    every = F.scaled_dot_product_attention(  # (B, nh, G, hd)
        q.gather(2, index), k, v, attn_mask=open_empty_rows(sees[:, None]),
        dropout_p=dropout_p, scale=scale)
    every = torch.where(is_global[:, None, :, None], every, context.gather(2, index))
    return context.scatter(2, index, every)


def _tokens(inputs: WindowInputs, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(real, global) (B, T) bool."""
    batch, length = q.shape[0], q.shape[2]
    real = inputs.keys.bool() if inputs.keys is not None else q.new_ones(batch, length, dtype=torch.bool)
    glob = (inputs.global_tokens.bool() if inputs.global_tokens is not None
            else torch.zeros_like(real))
    return real, glob
