"""AWD-LSTM's regularisers (Merity et al. 2017), which leave torch's fused LSTM kernel in use:
DropConnect on ``W_hh`` (:class:`WeightDropLSTM`), whole-word embedding dropout and locked
(variational) dropout.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F


class LockedDropout(nn.Module):
    """Variational dropout: the same units dropped at every time step of a sequence."""

    def __init__(self, p: float):
        super().__init__()
        self.p = float(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (B, T, H) -> (B, T, H) with a (B, 1, H) mask (identity in eval mode)."""
        if not self.training or self.p == 0.0:
            return x
        mask = x.new_empty(x.shape[0], 1, x.shape[2]).bernoulli_(1 - self.p) / (1 - self.p)
        return x * mask  # (B, T, H): the mask broadcast over time

    def extra_repr(self) -> str:
        return f"p={self.p}"


def embedding_dropout(embedding: nn.Embedding, input_ids: torch.Tensor, p: float,
                      training: bool) -> torch.Tensor:
    """Look ``input_ids`` up in ``embedding`` with whole words dropped (probability ``p``; the
    kept rows scaled by ``1 / (1 - p)``) in training, plainly otherwise."""
    weight = embedding.weight
    if training and p > 0.0:
        mask = weight.new_empty(weight.shape[0], 1).bernoulli_(1 - p) / (1 - p)  # (V, 1)
        weight = weight * mask
    return F.embedding(input_ids, weight, embedding.padding_idx)


class WeightDropLSTM(nn.Module):
    """One LSTM layer (torch's fused kernel, ``self.lstm``) with DropConnect on ``W_hh``: in
    training a dropped copy of ``weight_hh_l0`` is substituted for one call
    (``torch.func.functional_call``), so the raw matrix gets the gradient and is never
    overwritten."""

    def __init__(self, input_size: int, hidden_size: int, weight_p: float = 0.0,
                 proj_size: int = 0):
        super().__init__()
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers=1, batch_first=True,
                            proj_size=proj_size)
        self.weight_p = float(weight_p)

    @property
    def output_size(self) -> int:
        return self.lstm.proj_size or self.lstm.hidden_size

    def forward(self, x: torch.Tensor,
                state: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """``x`` (B, T, in) -> outputs (B, T, out) and the final (h, c)."""
        if self.training and self.weight_p > 0.0:
            dropped = F.dropout(self.lstm.weight_hh_l0, self.weight_p, training=True)
            return functional_call(self.lstm, {"weight_hh_l0": dropped}, (x, state))
        return self.lstm(x, state)

    def extra_repr(self) -> str:
        return f"weight_p={self.weight_p}"


def reverse_padded(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Reverse each row's first ``lengths[b]`` steps of ``x`` (B, T, ...), its right padding
    left in place: a backward LSTM is a forward one on reversed rows (its own inverse)."""
    steps = torch.arange(x.shape[1], device=x.device).unsqueeze(0)  # (1, T)
    lengths = lengths.to(x.device).unsqueeze(1)  # (B, 1)
    index = torch.where(steps < lengths, lengths - 1 - steps, steps)  # (B, T)
    index = index.view(*index.shape, *([1] * (x.dim() - 2))).expand_as(x)
    return x.gather(1, index)
