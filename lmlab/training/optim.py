"""AdamW with BERT's weight-decay exclusions: biases and norm parameters (recognised by module
type) are not decayed, embeddings are; tied parameters are listed once."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from lmlab.models.core.norms import RMSNorm

NORM_TYPES: tuple[type[nn.Module], ...] = (nn.LayerNorm, RMSNorm, nn.GroupNorm,
                                           nn.BatchNorm1d)


def no_decay_names(module: nn.Module) -> set[str]:
    """Names of ``module``'s parameters not to decay: biases and normalisation parameters."""
    names: set[str] = set()
    for module_name, sub in module.named_modules():
        for param_name, _ in sub.named_parameters(recurse=False):
            full = f"{module_name}.{param_name}" if module_name else param_name
            if param_name == "bias" or param_name.endswith("_bias") or isinstance(sub, NORM_TYPES):
                names.add(full)
    return names


def param_groups(modules: Iterable[nn.Module], weight_decay: float) -> list[dict[str, Any]]:
    """Two AdamW groups over the trainable parameters of ``modules``: ``decay`` and
    ``no_decay``, each with ``names`` (for logs and tests; torch ignores extra keys)."""
    groups = {name: {"params": [], "weight_decay": decay, "names": [], "group": name}
              for name, decay in (("decay", weight_decay), ("no_decay", 0.0))}
    seen: set[int] = set()
    for index, module in enumerate(modules):
        exempt = no_decay_names(module)
        for name, parameter in module.named_parameters():
            if not parameter.requires_grad or id(parameter) in seen:
                continue
            seen.add(id(parameter))
            group = groups["no_decay" if name in exempt else "decay"]
            group["params"].append(parameter)
            group["names"].append(f"{index}:{name}")
    return [group for group in groups.values() if group["params"]]


OPTIMIZERS = ("adamw", "nt-asgd")


def build_optimizer(groups: list[dict[str, Any]], lr: float, betas: tuple[float, float],
                    eps: float, weight_decay: float,
                    kind: str | None = None) -> torch.optim.Optimizer:
    """AdamW (or AWD-LSTM's NT-ASGD, :mod:`lmlab.training.ntasgd`) over ``groups``; each
    group's ``lr`` defaults to ``lr`` and is kept as ``initial_lr`` so schedules multiply it
    (discriminative LRs survive scheduling)."""
    prepared = []
    for group in groups:
        group = dict(group)
        group.setdefault("lr", lr)
        group.setdefault("weight_decay", weight_decay)
        group["initial_lr"] = group["lr"]
        prepared.append(group)
    if kind == "nt-asgd":
        from lmlab.training.ntasgd import NTASGD

        return NTASGD(prepared, lr=lr, weight_decay=weight_decay)
    return torch.optim.AdamW(prepared, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                             fused=fused_adamw(prepared) or None)


def fused_adamw(groups: list[dict[str, Any]]) -> bool:
    """Whether torch's fused AdamW (one kernel per tensor) can update ``groups``: plain
    floating-point tensors on the CPU or a CUDA GPU. On the CPU torch otherwise runs a loop of
    small ops per tensor; the fused step is several times faster with the same update up to
    float rounding (bench/bench_elementwise.py, docs/benchmarks.md)."""
    return all(type(p.data) is torch.Tensor and p.is_floating_point()
               and p.device.type in ("cpu", "cuda") for g in groups for p in g["params"])


def discriminative_param_groups(tiers: list[tuple[list[nn.Module], float, int, dict[str, Any]]],
                                weight_decay: float) -> list[dict[str, Any]]:
    """Optimizer groups of ``tiers`` (modules, learning rate, depth, extra keys), each split into
    decay / no-decay parameters; a parameter goes to the first tier that holds it (ULMFiT's
    discriminative rates: ``lr / lr_decay**depth`` by layer group from the top)."""
    groups: list[dict[str, Any]] = []
    seen: set[int] = set()
    for modules, rate, depth, marks in tiers:
        for group in param_groups(modules, weight_decay):
            params = [p for p in group["params"] if id(p) not in seen]
            seen.update(id(p) for p in params)
            if params:
                groups.append({"params": params, "weight_decay": group["weight_decay"],
                               "lr": rate, "depth": depth, **marks})
    return groups


def layer_rate_groups(model: nn.Module, extra: list[nn.Module], lr: float, lr_decay: float,
                      weight_decay: float) -> list[dict[str, Any]]:
    """:func:`discriminative_param_groups` over ``model.layer_groups()`` (a recurrent model's:
    heads, top layer, ..., token representation) with ``extra`` modules (the objective's) at
    the top rate."""
    from lmlab.utils.errors import LmlabError

    if not hasattr(model, "layer_groups"):
        raise LmlabError(f"lr_decay sets a rate per layer group, which a "
                         f"{type(model).__name__} does not define here",
                         "drop lr_decay (discriminative rates in pretraining are ULMFiT's, for "
                         "--family awd-lstm or elmo; fine-tuning has them for every model)")
    tiers = [(modules, lr / lr_decay ** depth, depth, {})
             for depth, modules in enumerate(model.layer_groups())]
    return discriminative_param_groups(tiers + [(extra, lr, 0, {})], weight_decay)


def set_lr(optimizer: torch.optim.Optimizer, factor: float) -> float:
    """Set every group's LR to ``initial_lr * factor``; returns the first group's LR."""
    for group in optimizer.param_groups:
        group["lr"] = group["initial_lr"] * factor
    return optimizer.param_groups[0]["lr"]
