"""Skipping padding: the token-wise work runs on the real tokens gathered into one (N, H) matrix;
only the attention product sees the padded (B, T) layout (docs/models.md, "Padding is skipped").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PaddingIndex:
    """Where the real tokens of a (B, T) batch sit in its flattened (B*T) layout."""

    indices: torch.Tensor  # (N,) positions of real tokens in the flattened batch
    batch: int
    length: int

    @classmethod
    def from_mask(cls, attention_mask: torch.Tensor) -> PaddingIndex:
        batch, length = attention_mask.shape
        indices = attention_mask.reshape(-1).nonzero().squeeze(-1)
        return cls(indices, batch, length)

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (N, D)."""
        return x.reshape(self.batch * self.length, -1).index_select(0, self.indices)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(N, D) -> (B, T, D) with zeros at padding positions."""
        out = x.new_zeros(self.batch * self.length, x.shape[-1])
        out.index_copy_(0, self.indices, x)
        return out.view(self.batch, self.length, -1)
