"""LoRA (Hu et al. 2021): a frozen linear layer learns ``s * B A`` (``B`` zero at the start, ``A``
initialised as PEFT's). ``lora_A``/``lora_B`` become children of the ``nn.Linear`` with a
forward hook, so base names stay; :func:`merge_lora` folds the update into the weight."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from lmlab.utils.errors import LmlabError

#: lmlab's projection names; every layer has them (gate_proj in gated feed-forwards only).
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraSettings:
    """``targets``: lmlab projection names (:data:`PROJECTIONS`); ``dropout`` on the update's
    input; ``rslora``: scale by ``alpha / sqrt(r)`` instead of ``alpha / r``."""

    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = ("q_proj", "v_proj")
    rslora: bool = False

    @property
    def scaling(self) -> float:
        return self.alpha / (math.sqrt(self.r) if self.rslora else self.r)

    def check(self) -> None:
        if int(self.r) != self.r or self.r < 1:
            raise LmlabError(f"LoRA rank must be a positive integer, got {self.r!r}",
                             "pass r (--lora-r) of 1 or more, e.g. 8")
        if self.alpha <= 0:
            raise LmlabError(f"LoRA alpha must be positive, got {self.alpha!r}",
                             "pass alpha (--lora-alpha) > 0, e.g. twice the rank")
        if not 0.0 <= self.dropout < 1.0:
            raise LmlabError(f"LoRA dropout must be in [0, 1), got {self.dropout!r}",
                             "pass dropout between 0 and 1, e.g. 0.1")
        unknown = [t for t in self.targets if t not in PROJECTIONS]
        if unknown or not self.targets:
            raise LmlabError(f"unknown LoRA target module(s) {unknown or '(none)'}",
                             f"target some of {', '.join(PROJECTIONS)}")


def _lora_hook(module: nn.Linear, inputs: tuple[torch.Tensor, ...], output: torch.Tensor
               ) -> torch.Tensor:
    """``W x + b`` (``output``) plus ``s * B A dropout(x)``."""
    x = inputs[0]
    update = module.lora_B(module.lora_A(module.lora_dropout(x.to(module.lora_A.weight.dtype))))
    return output + module.lora_scaling * update.to(output.dtype)


def add_lora(linear: nn.Linear, r: int, scaling: float, dropout: float) -> None:
    """Give ``linear`` a LoRA update (``B`` zero: the function is unchanged)."""
    if hasattr(linear, "lora_A"):
        raise LmlabError("this layer already has a LoRA update", "apply LoRA once")
    weight = linear.weight
    linear.lora_A = nn.Linear(linear.in_features, r, bias=False, device=weight.device,
                              dtype=weight.dtype)
    linear.lora_B = nn.Linear(r, linear.out_features, bias=False, device=weight.device,
                              dtype=weight.dtype)
    nn.init.kaiming_uniform_(linear.lora_A.weight, a=math.sqrt(5))  # as PEFT
    nn.init.zeros_(linear.lora_B.weight)
    linear.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
    linear.lora_scaling = float(scaling)
    linear.register_forward_hook(_lora_hook)


def lora_layers(model: nn.Module) -> dict[str, nn.Linear]:
    """The linear layers of ``model`` that carry a LoRA update, by module name."""
    return {name: module for name, module in model.named_modules()
            if isinstance(module, nn.Linear) and hasattr(module, "lora_A")}


def target_linears(model: nn.Module, targets: Sequence[str]) -> dict[str, nn.Linear]:
    """The layers' projections named in ``targets`` (inside ``transformer.layers``)."""
    found = {}
    for name, module in model.named_modules():
        parts = name.split(".")
        if (isinstance(module, nn.Linear) and parts[-1] in targets
                and ".layers." in f".{name}" and not hasattr(module, "lora_A")):
            found[name] = module
    return found


def apply_lora(model: nn.Module, settings: LoraSettings) -> list[str]:
    """Add LoRA to every targeted projection of ``model``; no base parameter trains."""
    settings.check()
    targets = target_linears(model, settings.targets)
    if not targets:
        raise LmlabError(f"the model has none of the LoRA targets {list(settings.targets)}",
                         f"target projections it has (of {', '.join(PROJECTIONS)})")
    for linear in targets.values():
        add_lora(linear, int(settings.r), settings.scaling, settings.dropout)
    return []


def lora_delta(linear: nn.Linear) -> torch.Tensor:
    """``s * B A`` (out, in): what merging adds to the weight."""
    a, b = linear.lora_A.weight, linear.lora_B.weight
    return (linear.lora_scaling * (b.float() @ a.float())).to(linear.weight.dtype)


def remove_lora(linear: nn.Linear) -> None:
    """Remove the update's children and its hook, found by identity (no handle is kept, so a
    deep copy of the model carries its hooks)."""
    for key in [k for k, fn in linear._forward_hooks.items() if fn is _lora_hook]:
        del linear._forward_hooks[key]
    for attribute in ("lora_A", "lora_B", "lora_dropout", "lora_scaling"):
        delattr(linear, attribute)


def merge_lora(model: nn.Module) -> int:
    """Fold every LoRA update into its base weight (``W += s B A``) and remove it; the model
    is then a plain one (saved and loaded as any other). Returns how many layers merged."""
    layers = lora_layers(model)
    with torch.no_grad():
        for linear in layers.values():
            linear.weight += lora_delta(linear)
            remove_lora(linear)
    return len(layers)
