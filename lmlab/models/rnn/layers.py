"""AWD-LSTM's regularisers (Merity et al. 2017), which leave torch's fused LSTM kernel in use:
DropConnect on ``W_hh`` (:class:`WeightDropLSTM`), whole-word embedding dropout and locked
(variational) dropout; and ELMo's cell and projection clipping (:func:`clipped_lstm`, a loop
over time steps: no fused kernel clips).
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


def clipped_lstm(x: torch.Tensor, lstm: nn.LSTM, weight_hh: torch.Tensor,
                 cell_clip: float | None, proj_clip: float | None
                 ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """``lstm`` (one layer, batch first, zero start) on ``x`` (B, T, in) step by step, the cell
    clamped to ``[-cell_clip, cell_clip]`` after each update and the (projected) output to
    ``[-proj_clip, proj_clip]``, as bilm-tf's ``LSTMCell(cell_clip, proj_clip)`` and AllenNLP's
    ``LstmCellWithProjection``; returns what ``nn.LSTM`` returns."""
    batch, steps, _ = x.shape
    projection = getattr(lstm, "weight_hr_l0", None) if lstm.proj_size else None
    inputs = F.linear(x, lstm.weight_ih_l0, lstm.bias_ih_l0 + lstm.bias_hh_l0)  # (B, T, 4C)
    h = x.new_zeros(batch, lstm.proj_size or lstm.hidden_size)
    c = x.new_zeros(batch, lstm.hidden_size)
    outputs = []
    for t in range(steps):
        i, f, g, o = (inputs[:, t] + F.linear(h, weight_hh)).chunk(4, dim=-1)  # (B, C) each
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        if cell_clip is not None:
            c = c.clamp(-cell_clip, cell_clip)
        h = torch.sigmoid(o) * torch.tanh(c)
        if projection is not None:
            h = F.linear(h, projection)
        if proj_clip is not None:
            h = h.clamp(-proj_clip, proj_clip)
        outputs.append(h)
    return torch.stack(outputs, dim=1), (h.unsqueeze(0), c.unsqueeze(0))  # (B, T, out)


class WeightDropLSTM(nn.Module):
    """One LSTM layer (torch's fused kernel, ``self.lstm``) with DropConnect on ``W_hh``: in
    training a dropped copy of ``weight_hh_l0`` is substituted for one call
    (``torch.func.functional_call``), so the raw matrix gets the gradient and is never
    overwritten. ``cell_clip``/``proj_clip`` (ELMo's) run :func:`clipped_lstm` instead."""

    def __init__(self, input_size: int, hidden_size: int, weight_p: float = 0.0,
                 proj_size: int = 0, cell_clip: float | None = None,
                 proj_clip: float | None = None):
        super().__init__()
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers=1, batch_first=True,
                            proj_size=proj_size)
        self.weight_p = float(weight_p)
        self.cell_clip = None if cell_clip is None else float(cell_clip)
        self.proj_clip = None if proj_clip is None else float(proj_clip)

    @property
    def output_size(self) -> int:
        return self.lstm.proj_size or self.lstm.hidden_size

    def forward(self, x: torch.Tensor,
                state: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """``x`` (B, T, in) -> outputs (B, T, out) and the final (h, c)."""
        weight_hh = self.lstm.weight_hh_l0
        if self.training and self.weight_p > 0.0:
            weight_hh = F.dropout(weight_hh, self.weight_p, training=True)
        if self.cell_clip is not None or self.proj_clip is not None:
            if state is not None:
                raise ValueError("a clipped LSTM starts from a zero state")
            return clipped_lstm(x, self.lstm, weight_hh, self.cell_clip, self.proj_clip)
        if weight_hh is not self.lstm.weight_hh_l0:
            return functional_call(self.lstm, {"weight_hh_l0": weight_hh}, (x, state))
        return self.lstm(x, state)

    def extra_repr(self) -> str:
        clips = "" if self.cell_clip is None and self.proj_clip is None else (
            f", cell_clip={self.cell_clip}, proj_clip={self.proj_clip}")
        return f"weight_p={self.weight_p}{clips}"


def reverse_padded(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Reverse each row's first ``lengths[b]`` steps of ``x`` (B, T, ...), its right padding
    left in place: a backward LSTM is a forward one on reversed rows (its own inverse)."""
    steps = torch.arange(x.shape[1], device=x.device).unsqueeze(0)  # (1, T)
    lengths = lengths.to(x.device).unsqueeze(1)  # (B, 1)
    index = torch.where(steps < lengths, lengths - 1 - steps, steps)  # (B, T)
    index = index.view(*index.shape, *([1] * (x.dim() - 2))).expand_as(x)
    return x.gather(1, index)
