"""Activation functions by the names Hugging Face configs use."""

from __future__ import annotations

import math

import torch
from torch import nn

from lmlab.utils.checks import check_choice


class GELUTanh(nn.Module):
    """GELU with the tanh approximation (GPT-2's ``gelu_new``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


_ACTIVATIONS = {
    "gelu": lambda: nn.GELU(),
    "gelu_python": lambda: nn.GELU(),
    "gelu_new": GELUTanh,
    "gelu_fast": GELUTanh,
    "gelu_pytorch_tanh": lambda: nn.GELU(approximate="tanh"),
    "relu": nn.ReLU,
    "silu": nn.SiLU,
    "swish": nn.SiLU,
    "tanh": nn.Tanh,
}
ACTIVATION_NAMES = tuple(_ACTIVATIONS)  # every hidden_act name a config may use


def activation(name: str) -> nn.Module:
    """The activation module for a config's ``hidden_act`` name."""
    check_choice(name, sorted(_ACTIVATIONS), "hidden_act", "activation")
    return _ACTIVATIONS[name]()

