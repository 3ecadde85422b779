"""Position-wise feed-forward blocks: the classic MLP and the gated variants (SwiGLU, GeGLU)."""

from __future__ import annotations

import torch
from torch import nn

from lmlab.models.config import TransformerConfig
from lmlab.models.core.activations import activation


class FeedForward(nn.Module):
    """``down(act(up(x)))`` for ``ffn_type="mlp"``; ``down(act(gate(x)) * up(x))`` for ``"glu"``
    (SwiGLU with ``hidden_act="silu"`` as in Llama; GeGLU with ``"gelu"``)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        hidden, inner, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gated = config.ffn_type == "glu"
        self.up_proj = nn.Linear(hidden, inner, bias=bias)
        self.gate_proj = nn.Linear(hidden, inner, bias=bias) if self.gated else None
        self.down_proj = nn.Linear(inner, hidden, bias=bias)
        self.act = activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(self.act(self.up_proj(x)))
