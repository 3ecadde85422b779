"""Model outputs: dataclasses with the Hugging Face field names, readable as attributes or keys."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch


@dataclass
class ModelOutput:
    """What a model returns: the stack's output (the bare stack fills only that: on request the
    L + 1 hidden states, the last after a final norm, and each layer's (cross-)attention
    probabilities (B, nh, Tq, Tk)), plus the heads' logits and a loss."""

    last_hidden_state: torch.Tensor
    logits: torch.Tensor | None = None
    loss: torch.Tensor | None = None
    pooler_output: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    past_key_values: Any = None
    head_logits: dict[str, torch.Tensor] = field(default_factory=dict)
    encoder_last_hidden_state: torch.Tensor | None = None  # encoder-decoders: the source side
    encoder_attentions: tuple[torch.Tensor, ...] | None = None  # encoder-decoders, on request
    cross_attentions: tuple[torch.Tensor, ...] | None = None  # (B, nh, Tq, S) per decoder layer
    mems: tuple[torch.Tensor, ...] | None = None  # XLNet: each layer's memory (B, M, H)

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    def keys(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]
