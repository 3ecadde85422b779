"""Skipping padding: run the token-wise work only on real tokens.

In a batch padded to its longest sentence, every linear layer, norm and feed-forward block
also processes the padding. With ``skip_padding`` (on by default) the stack gathers the real
tokens into one (N, H) matrix, runs those parts on N rows instead of B*T, and pads only around
the attention product (which needs the (B, T) layout), then scatters the result back. Outputs at real tokens
are unchanged up to float noise; outputs at padding positions are zeros instead of the
meaningless values a padded computation leaves there.
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
