"""The recurrent models' building blocks: AWD-LSTM's dropouts and a weight-dropped LSTM layer.

Merity et al. 2017 ("Regularizing and Optimizing LSTM Language Models") regularise an LSTM LM
without touching the fused LSTM kernel:

* :class:`WeightDropLSTM`: DropConnect on the hidden-to-hidden matrix ``W_hh`` — one mask per
  forward pass, shared by every time step, so the recurrence itself is regularised while the
  kernel (torch's fused ``nn.LSTM``, cuDNN on a GPU) still runs. Only in training.
* :func:`embedding_dropout`: drops whole words — rows of the embedding matrix — and scales the
  kept ones by ``1 / (1 - p)``.
* :class:`LockedDropout` (variational dropout, Gal & Ghahramani 2016): one mask per sequence,
  shared over time, on the embeddings' output, between layers and on the last output.
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
    """One unidirectional LSTM layer (torch's fused kernel) with DropConnect on ``W_hh``.

    The parameters are those of ``self.lstm`` (an ``nn.LSTM`` with one layer, batch first;
    ``proj_size`` for ELMo's projected cells), so a checkpoint is torch's LSTM layout. In
    training with ``weight_p > 0`` the forward pass runs ``self.lstm`` with a dropped copy of
    ``weight_hh_l0`` substituted (``torch.func.functional_call``): the gradient reaches the raw
    matrix through the mask, and the module's own weights are never overwritten.
    """

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
    """Reverse each row's first ``lengths[b]`` steps, leaving its right padding in place:
    ``x`` (B, T, ...) -> (B, T, ...). Applied twice it is the identity, so a backward LSTM is a
    forward one run on reversed rows (no packing, padding stays at the end)."""
    steps = torch.arange(x.shape[1], device=x.device).unsqueeze(0)  # (1, T)
    lengths = lengths.to(x.device).unsqueeze(1)  # (B, 1)
    index = torch.where(steps < lengths, lengths - 1 - steps, steps)  # (B, T)
    index = index.view(*index.shape, *([1] * (x.dim() - 2))).expand_as(x)
    return x.gather(1, index)
