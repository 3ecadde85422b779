"""Normalisation layers: LayerNorm (BERT, GPT-2) and RMSNorm (Llama, T5)."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """Root-mean-square norm: ``x / sqrt(mean(x^2) + eps) * weight``, computed in fp32 as Llama
    does so bf16 activations do not lose the statistic."""

    def __init__(self, size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def make_norm(kind: str, size: int, eps: float) -> nn.Module:
    """A LayerNorm or RMSNorm of width ``size``."""
    if kind == "rmsnorm":
        return RMSNorm(size, eps)
    return nn.LayerNorm(size, eps=eps)
