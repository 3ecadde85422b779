"""Fine-tuning recipes: BERT's, ULMFiT's and the feature-based (ELMo-style) one.

* ``bert`` (Devlin et al. 2019): AdamW, lr in 2e-5..5e-5, 2-4 epochs, 10% linear warmup then
  linear decay, batch 16-32, every weight trained.
* ``ulmfit`` (Howard & Ruder 2018): discriminative learning rates (layer group at depth d from
  the top gets ``lr / 2.6**d``), gradual unfreezing (epoch k trains the top k+1 groups), slanted
  triangular learning rates (cut_frac 0.1, ratio 32), concat pooling ``[last, max, mean]``.
* ``feature`` (Peters et al. 2018; the BERT paper's feature-based comparison): the encoder is
  frozen; only a head over a chosen layer, or over a learned scalar mix of all layers
  (``gamma * sum_j softmax(w)_j h_j``), is trained.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
from torch import nn

from lmlab.utils.errors import LmlabError
from lmlab.utils.precision import precision_autocast


@dataclass(frozen=True)
class Recipe:
    """Hyperparameters of one fine-tuning recipe (``replace`` to override)."""

    name: str
    lr: float
    epochs: int
    batch_size: int
    schedule: str = "linear"
    warmup_fraction: float = 0.1
    weight_decay: float = 0.01
    clip_norm: float | None = 1.0
    lr_decay: float = 1.0  # discriminative: lr / lr_decay**depth (ULMFiT: 2.6)
    gradual_unfreeze: bool = False
    frozen_encoder: bool = False
    layer: int | None = None  # feature-based: which hidden state (-1 = last); None = scalar mix
    pooling: str = "family"
    patience: int = 2  # early stopping: epochs without dev improvement
    max_length: int = 128

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


RECIPES: dict[str, Recipe] = {
    "bert": Recipe("bert", lr=5e-5, epochs=3, batch_size=32),
    "ulmfit": Recipe("ulmfit", lr=2e-4, epochs=4, batch_size=32, schedule="triangular",
                     warmup_fraction=0.0, lr_decay=2.6, gradual_unfreeze=True, pooling="concat"),
    "feature": Recipe("feature", lr=2e-3, epochs=10, batch_size=32, frozen_encoder=True,
                      layer=None, pooling="mean", weight_decay=0.0, patience=3),
}


def get_recipe(name: str, **overrides: Any) -> Recipe:
    """A recipe by name with ``overrides`` (None values are ignored)."""
    if name not in RECIPES:
        raise LmlabError(f"unknown recipe {name!r}", f"use one of {', '.join(RECIPES)}")
    return replace(RECIPES[name], **{k: v for k, v in overrides.items() if v is not None})


# -- ULMFiT: layer groups, discriminative learning rates, gradual unfreezing --------------------
def layer_groups(model: nn.Module) -> list[list[nn.Module]]:
    """Modules from the top: [heads + pooler (+ final norm)], last layer, ..., first layer,
    embeddings. ALBERT's one shared layer is one group."""
    transformer = model.transformer
    top: list[nn.Module] = list(model.heads.values())
    if model.pooler is not None:
        top.append(model.pooler)
    if transformer.final_norm is not None:
        top.append(transformer.final_norm)
    groups = [top] + [[layer] for layer in reversed(list(transformer.layers))]
    groups.append([transformer.embeddings])
    return groups


def discriminative_groups(model: nn.Module, lr: float, lr_decay: float,
                          weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups with ``lr / lr_decay**depth`` per layer group (depth 0 = the head), each
    split into decay / no-decay parameters as BERT does."""
    from lmlab.training.optim import param_groups

    groups: list[dict[str, Any]] = []
    seen: set[int] = set()
    for depth, modules in enumerate(layer_groups(model)):
        for group in param_groups(modules, weight_decay):
            params = [p for p in group["params"] if id(p) not in seen]
            seen.update(id(p) for p in params)
            if params:
                groups.append({"params": params, "weight_decay": group["weight_decay"],
                               "lr": lr / lr_decay ** depth, "depth": depth})
    return groups


def unfreeze_to(model: nn.Module, depth: int) -> int:
    """Gradual unfreezing: train the layer groups of depth <= ``depth``; returns how many
    parameters are trainable."""
    groups = layer_groups(model)
    for index, modules in enumerate(groups):
        for module in modules:
            for parameter in module.parameters():
                parameter.requires_grad_(index <= depth)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# -- feature-based: scalar mix over frozen layers ----------------------------------------------
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


class FeatureHead(nn.Module):
    """Classifier over frozen features: a chosen layer or a learned scalar mix, then dropout and
    a linear layer. Reads pre-pooled per-layer sentence vectors (N, L+1, H): pooling is linear,
    so pooling then mixing equals mixing then pooling, and the frozen encoder runs once."""

    def __init__(self, num_layers: int, hidden: int, outputs: int, layer: int | None,
                 dropout: float = 0.1):
        super().__init__()
        self.layer = layer
        self.mix = ScalarMix(num_layers) if layer is None else None
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden, outputs)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        vector = self.mix(features) if self.mix is not None else features[:, self.layer]
        return self.classifier(self.dropout(vector))


@torch.no_grad()
def layer_features(model: nn.Module, batches, pooling: str = "mean",
                   precision: str = "fp32") -> tuple[list[int], torch.Tensor]:
    """Per-layer sentence vectors of a frozen encoder: (N, L+1, H) in the order of ``batches``'
    indices. ``pooling`` ``mean`` (real tokens) or ``cls`` (first token)."""
    from lmlab.finetune.heads import masked_mean

    model.eval()
    order: list[int] = []
    chunks = []
    for indices, batch in batches:
        with precision_autocast(precision, "cpu"):
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                        token_type_ids=batch.get("token_type_ids"), heads=[],
                        output_hidden_states=True)
        states = torch.stack(out.hidden_states, dim=1).float()  # (B, L+1, T, H)
        if pooling == "cls":
            pooled = states[:, :, 0]
        else:
            mask = batch["attention_mask"][:, None, :]  # (B, 1, T)
            pooled = masked_mean(states.flatten(0, 1), mask.expand(-1, states.shape[1], -1)
                                 .flatten(0, 1)).view(states.shape[0], states.shape[1], -1)
        order += list(indices)
        chunks.append(pooled)
    features = torch.cat(chunks)
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.tensor(order)] = torch.arange(len(order))
    return sorted(order), features[inverse]
