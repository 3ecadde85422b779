"""Position information that is not a learned table: sinusoids (Vaswani et al.) and RoPE."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from lmlab.models.core.rope import ROPE_TYPES, rope_frequencies

SINUSOID_LAYOUTS = ("interleaved", "halves")


def sinusoidal_table(num_positions: int, dim: int, layout: str = "interleaved") -> torch.Tensor:
    """The fixed (num_positions, dim) sin/cos table of Vaswani et al. at frequencies
    ``10000^(-2i/dim)``: sine and cosine interleaved (the paper, DistilBERT) or in "halves"
    (Marian, fairseq: every sine, then every cosine)."""
    if layout not in SINUSOID_LAYOUTS:
        raise ValueError(f"sinusoid layout {layout!r}; known: {', '.join(SINUSOID_LAYOUTS)}")
    position = torch.arange(num_positions, dtype=torch.float64).unsqueeze(1)  # (P, 1)
    div = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(10000.0) / dim))
    sines, cosines = torch.sin(position * div), torch.cos(position * div[: dim // 2])
    if layout == "halves":
        table = torch.cat([sines, cosines], dim=1)  # (P, ceil(dim/2) + floor(dim/2))
    else:
        table = torch.zeros(num_positions, dim, dtype=torch.float64)
        table[:, 0::2] = sines
        table[:, 1::2] = cosines
    return table.float()  # computed in float64 as transformers does, then cast


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (Su et al. 2021) in Llama's "rotate half" layout: cos and sin
    (B, T, head_dim) for :func:`apply_rotary`, at the frequencies of ``scaling`` (a checked
    ``rope_scaling``, :mod:`lmlab.models.core.rope`). Dynamic NTK recomputes them as
    transformers does: when a forward's positions pass the longest seen (kept until one fits
    within ``max_positions`` again)."""

    def __init__(self, head_dim: int, theta: float = 10000.0,
                 scaling: dict[str, Any] | None = None, max_positions: int = 2048):
        super().__init__()
        self.head_dim, self.theta, self.scaling = head_dim, theta, scaling
        self.max_positions = self.longest = max_positions
        inv_freq, self.attention_factor = rope_frequencies(head_dim, theta, scaling, max_positions)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("original_inv_freq", inv_freq.clone(), persistent=False)
        self.per_length = scaling is not None and ROPE_TYPES[scaling["rope_type"]].per_length

    def _dynamic_update(self, position_ids: torch.Tensor) -> None:
        length = position_ids.max() + 1
        if length > self.longest:  # a longer sequence: a larger base
            inv_freq, _ = rope_frequencies(self.head_dim, self.theta, self.scaling,
                                           self.max_positions, seq_len=length)
            self.inv_freq, self.longest = inv_freq.to(self.inv_freq.device), int(length)
        if length < self.max_positions < self.longest:  # back within the trained context
            self.inv_freq, self.longest = self.original_inv_freq.clone(), self.max_positions

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.per_length:
            self._dynamic_update(position_ids)
        freqs = position_ids.float().unsqueeze(-1) * self.inv_freq  # (B, T, hd/2)
        angles = torch.cat([freqs, freqs], dim=-1)  # (B, T, hd)
        return angles.cos() * self.attention_factor, angles.sin() * self.attention_factor


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (B, nh, T, hd) by the angles for its positions (cos/sin: (B, T, hd))."""
    cos = cos.unsqueeze(1).to(x.dtype)  # (B, 1, T, hd)
    sin = sin.unsqueeze(1).to(x.dtype)
    return x * cos + _rotate_half(x) * sin


def _swap_row_halves(weight: torch.Tensor, head_dim: int, split: tuple[int, int]) -> torch.Tensor:
    """Each head's rows viewed as ``split`` (its first two axes) and transposed."""
    if head_dim % 2 or weight.shape[0] % head_dim:
        raise ValueError(f"{weight.shape[0]} rows are not whole heads of an even head_dim "
                         f"{head_dim}")
    w = weight.reshape(weight.shape[0] // head_dim, *split, *weight.shape[1:])  # (nh, a, b, ...)
    return w.transpose(1, 2).reshape(weight.shape)  # (nh, b, a, ...) -> rows


def rotary_rows_from_pairs(weight: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Query/key rows (weight or bias) in adjacent-pair order (RoFormer, llama.cpp: dims 2i,
    2i+1 rotate together) put into :func:`apply_rotary`'s rotate-half order (i, i + hd/2)."""
    return _swap_row_halves(weight, head_dim, (head_dim // 2, 2))


def rotary_rows_to_pairs(weight: torch.Tensor, head_dim: int) -> torch.Tensor:
    """The inverse of :func:`rotary_rows_from_pairs`: rotate-half rows to adjacent pairs."""
    return _swap_row_halves(weight, head_dim, (2, head_dim // 2))


class RelativePositionBias(nn.Module):
    """T5's relative position bias (Raffel et al. 2020): a learned scalar per head and bucket of
    the key-minus-query distance, added to every layer's scores. Half the buckets hold exact
    distances, half grow logarithmically to ``max_distance``; an encoder splits them between
    keys before and after the query."""

    def __init__(self, num_buckets: int, max_distance: int, num_heads: int, bidirectional: bool):
        super().__init__()
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.bidirectional = bidirectional
        self.embedding = nn.Embedding(num_buckets, num_heads)

    def bucket(self, relative: torch.Tensor) -> torch.Tensor:
        """Bucket index of each ``key - query`` distance (same shape, long)."""
        buckets = self.num_buckets
        result = torch.zeros_like(relative)
        if self.bidirectional:
            buckets //= 2
            result = result + (relative > 0).long() * buckets
            distance = relative.abs()
        else:
            distance = -torch.clamp(relative, max=0)  # past keys only: distance >= 0
        exact = buckets // 2
        is_small = distance < exact
        large = exact + (torch.log(distance.float() / exact)
                         / math.log(self.max_distance / exact) * (buckets - exact)).long()
        large = torch.clamp(large, max=buckets - 1)
        return result + torch.where(is_small, distance, large)

    def forward(self, q_len: int, k_len: int, device: torch.device) -> torch.Tensor:
        """The bias (1, nh, Tq, Tk) for the newest ``q_len`` of ``k_len`` positions."""
        q_pos = torch.arange(k_len - q_len, k_len, device=device)[:, None]  # (Tq, 1)
        k_pos = torch.arange(k_len, device=device)[None, :]  # (1, Tk)
        values = self.embedding(self.bucket(k_pos - q_pos))  # (Tq, Tk, nh)
        return values.permute(2, 0, 1).unsqueeze(0)  # (1, nh, Tq, Tk)
