"""Bottleneck adapters (Houlsby et al. 2019) after every layer's attention and feed-forward
output: a child ``adapter`` of ``attention.o_proj`` and ``feed_forward.down_proj`` applied by a
forward hook, so base names stay; ``up`` starts at zero (the base model's function)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from lmlab.models.core.activations import activation
from lmlab.utils.errors import LmlabError

#: the sublayer outputs an adapter follows: (lmlab module path inside a layer)
ADAPTED = ("attention.o_proj", "feed_forward.down_proj")


@dataclass(frozen=True)
class AdapterSettings:
    bottleneck: int = 64
    activation: str = "gelu"
    train_norms: bool = True

    def check(self) -> None:
        if int(self.bottleneck) != self.bottleneck or self.bottleneck < 1:
            raise LmlabError(f"the adapter bottleneck must be a positive integer, got "
                             f"{self.bottleneck!r}", "pass bottleneck (--adapter-size) >= 1")


class Adapter(nn.Module):
    """``h + up(act(down(h)))``; ``up`` is zero at the start (the identity)."""

    def __init__(self, hidden: int, bottleneck: int, act: str, std: float = 1e-2):
        super().__init__()
        self.down = nn.Linear(hidden, bottleneck)
        self.up = nn.Linear(bottleneck, hidden)
        self.act = activation(act)
        nn.init.normal_(self.down.weight, std=std)
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.up(self.act(self.down(h)))


def _adapter_hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor
                  ) -> torch.Tensor:
    return module.adapter(output)


def apply_adapters(model: nn.Module, settings: AdapterSettings) -> list[str]:
    """Add an adapter after every layer's attention and feed-forward; returns the layers'
    norm parameters when they train too (``train_norms``, as Houlsby et al.)."""
    settings.check()
    named = dict(model.named_modules())
    names = [f"transformer.layers.{i}.{path}" for i in range(len(model.transformer.layers))
             for path in ADAPTED]
    for name in names:
        target = named[name]
        if hasattr(target, "adapter"):
            raise LmlabError(f"{name} already has an adapter", "apply adapters once")
        weight = target.weight
        target.adapter = Adapter(target.out_features, int(settings.bottleneck),
                                 settings.activation).to(weight.device, weight.dtype)
        target.register_forward_hook(_adapter_hook)
    if not settings.train_norms:
        return []
    from lmlab.training.optim import NORM_TYPES

    return [f"{module_name}.{name}" for module_name, module in model.named_modules()
            if isinstance(module, NORM_TYPES) and module_name.startswith("transformer.")
            for name, _ in module.named_parameters(recurse=False)]

