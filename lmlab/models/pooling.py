"""Pooling: per-token states to one vector per sequence (masked mean, ULMFiT's concat pool), or
the L + 1 layers to one (B, T, H) tensor (a fixed strategy, ELMo's scalar mix).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from lmlab.utils.errors import LmlabError


def masked_mean(hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of ``hidden`` (B, T, H) over real tokens -> (B, H)."""
    if attention_mask is None:
        return hidden.mean(1)
    mask = attention_mask.to(hidden.dtype).unsqueeze(-1)  # (B, T, 1)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)


def concat_pool(hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """ULMFiT's concat pooling ``[h_last, max_t h_t, mean_t h_t]`` over real tokens -> (B, 3H)."""
    if attention_mask is None:
        attention_mask = torch.ones(hidden.shape[:2], dtype=torch.long, device=hidden.device)
    lengths = attention_mask.long().sum(1).clamp(min=1)  # (B,)
    last = hidden[torch.arange(hidden.shape[0], device=hidden.device), lengths - 1]  # (B, H)
    masked = hidden.masked_fill(~attention_mask.bool().unsqueeze(-1), float("-inf"))
    return torch.cat([last, masked.max(1).values, masked_mean(hidden, attention_mask)], dim=-1)


def _weighted_sum(hidden: Sequence[torch.Tensor]) -> torch.Tensor:
    """All layers summed with equal weights 1 / (L+1)."""
    stacked = torch.stack(list(hidden))  # (L+1, B, T, H)
    return (stacked * (1.0 / stacked.shape[0])).sum(0)


STRATEGIES: dict[str, Callable[[Sequence[torch.Tensor]], torch.Tensor]] = {
    "embeddings": lambda hs: hs[0],
    "last": lambda hs: hs[-1],
    "second_to_last": lambda hs: hs[-2],
    "sum_last_four": lambda hs: torch.stack(list(hs[-4:])).sum(0),
    "concat_last_four": lambda hs: torch.cat(list(hs[-4:]), dim=-1),
    "weighted_sum_all": _weighted_sum,
}


def combine_layers(hidden_states: Sequence[torch.Tensor], layer: int | str = "last") -> torch.Tensor:
    """One (B, T, D) tensor from the per-layer hidden states: a layer index (0 = embeddings,
    -1 = last) or a strategy name of :data:`STRATEGIES`."""
    if isinstance(layer, int) or (isinstance(layer, str) and layer.lstrip("-").isdigit()):
        index = int(layer)
        if not -len(hidden_states) <= index < len(hidden_states):
            raise LmlabError(f"layer {index} does not exist (the model has "
                             f"{len(hidden_states) - 1} layers plus the embeddings, index 0)",
                             f"use a layer between 0 and {len(hidden_states) - 1}, or -1")
        return hidden_states[index]
    if layer not in STRATEGIES:
        raise LmlabError(f"unknown feature strategy {layer!r}",
                         f"use a layer index or one of {', '.join(STRATEGIES)}")
    summed = {"sum_last_four": hidden_states[-4:], "weighted_sum_all": hidden_states}
    widths = sorted({h.shape[-1] for h in summed.get(layer, ())})
    if len(widths) > 1:  # an AWD-LSTM's layers are E, H, H, E wide
        raise LmlabError(f"{layer!r} adds hidden states of different widths "
                         f"({', '.join(map(str, widths))}) in this model",
                         "use one layer index, or concat_last_four")
    return STRATEGIES[layer](hidden_states)


class ScalarMix(nn.Module):
    """ELMo's scalar mix: ``gamma * sum_j softmax(w)_j x_j`` over L+1 layer representations."""

    def __init__(self, num_layers: int):
        super().__init__()
        self.weights = nn.Parameter(torch.zeros(num_layers))
        self.gamma = nn.Parameter(torch.ones(()))

    def forward(self, layers: torch.Tensor) -> torch.Tensor:
        """``layers`` (..., L+1, H) -> (..., H)."""
        w = torch.softmax(self.weights, dim=0)  # (L+1,)
        return self.gamma * torch.einsum("l,...lh->...h", w, layers)


def scalar_mix(hidden_states: Sequence[torch.Tensor], weights: torch.Tensor,
               gamma: torch.Tensor | float = 1.0) -> torch.Tensor:
    """ELMo's task representation ``gamma * sum_j softmax(weights)_j h_j`` over the L + 1 hidden
    states (each (B, T, H)) -> (B, T, H); ``weights`` (L + 1,) unnormalised."""
    if weights.dim() != 1 or weights.shape[0] != len(hidden_states):
        raise LmlabError(f"the scalar mix has {weights.numel()} weights but the model gives "
                         f"{len(hidden_states)} layers (its {len(hidden_states) - 1} layers plus "
                         "the token layer)", f"use {len(hidden_states)} weights, one per layer")
    mix = torch.softmax(weights, dim=0)  # (L+1,)
    return gamma * torch.einsum("l,lbth->bth", mix, torch.stack(list(hidden_states)))
