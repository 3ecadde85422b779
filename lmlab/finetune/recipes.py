"""Fine-tuning recipes (``bert``, ``bert-paper``, ``scratch``, ``ulmfit``, ``feature``) and
ULMFiT's layer groups, discriminative learning rates and gradual unfreezing. docs/finetuning.md
gives each recipe's settings, its source and the measurements that chose them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from torch import nn

from lmlab.utils.checks import check_choice


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
    layer: int | str | None = None  # feature-based: hidden state (-1 = last), a STRATEGIES name
    #                                 (lmlab.analysis.features), or None = learned scalar mix
    pooling: str = "family"  # "auto": the checkpoint's own sentence vector (pooling.py)
    patience: int = 2  # early stopping: epochs without dev improvement
    max_length: int = 128
    head_lr_multiplier: float = 1.0  # the new task head trains at lr * this
    min_updates: int = 0  # train at least this many optimizer updates (more epochs if needed)
    head_hidden: int | None = None  # ULMFiT's batch-norm head layer (the paper: 50 units)

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        if values["head_hidden"] is None:  # as runs recorded before the field: they resume
            del values["head_hidden"]
        return values


RECIPES: dict[str, Recipe] = {
    "bert": Recipe("bert", lr=1e-4, epochs=3, batch_size=16, pooling="auto",
                   head_lr_multiplier=10.0, min_updates=500, patience=3),
    "bert-paper": Recipe("bert-paper", lr=5e-5, epochs=3, batch_size=32),
    "scratch": Recipe("scratch", lr=2.5e-4, epochs=3, batch_size=16, pooling="mean",
                      min_updates=1000, patience=3),
    "ulmfit": Recipe("ulmfit", lr=2e-4, epochs=4, batch_size=32, schedule="triangular",
                     warmup_fraction=0.0, lr_decay=2.6, gradual_unfreeze=True, pooling="concat"),
    # ULMFiT's ablation (Howard & Ruder 2018, table 6): every layer group trains from epoch 0
    "ulmfit-no-unfreeze": Recipe("ulmfit-no-unfreeze", lr=2e-4, epochs=4, batch_size=32,
                                 schedule="triangular", warmup_fraction=0.0, lr_decay=2.6,
                                 pooling="concat"),
    "feature": Recipe("feature", lr=2e-3, epochs=10, batch_size=32, frozen_encoder=True,
                      layer=None, pooling="mean", weight_decay=0.0, patience=3),
}


def default_recipe(random_init: bool) -> str:
    """The recipe a run gets when none is named: ``scratch`` for a random init, else ``bert``."""
    return "scratch" if random_init else "bert"


def epochs_for(recipe: Recipe, steps_per_epoch: int) -> int:
    """The recipe's epochs, raised so that training makes at least ``min_updates`` updates."""
    needed = -(-recipe.min_updates // max(steps_per_epoch, 1))  # ceil
    return max(recipe.epochs, needed)


def get_recipe(name: str, **overrides: Any) -> Recipe:
    """A recipe by name with ``overrides`` (None values are ignored)."""
    check_choice(name, RECIPES, "recipe", "recipe")
    return replace(RECIPES[name], **{k: v for k, v in overrides.items() if v is not None})


# -- ULMFiT: layer groups, discriminative learning rates, gradual unfreezing --------------------
def layer_groups(model: nn.Module) -> list[list[nn.Module]]:
    """Modules from the top: [heads + pooler (+ final norm)], last layer, ..., first layer,
    embeddings. ALBERT's one shared layer is one group. A model that defines its own groups
    (AWD-LSTM, ELMo: ``layer_groups()``) gives them."""
    if hasattr(model, "layer_groups"):
        return model.layer_groups()
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
                          weight_decay: float,
                          head_lr_multiplier: float = 1.0) -> list[dict[str, Any]]:
    """AdamW groups with ``lr / lr_decay**depth`` per layer group (depth 0 = the head), each
    split into decay / no-decay parameters as BERT does; the task heads' own parameters (not
    the pooler) get ``head_lr_multiplier`` times their group's rate (group key ``"head"``)."""
    from lmlab.training.optim import discriminative_param_groups

    tiers = [(list(model.heads.values()), lr * head_lr_multiplier, 0, {"head": True})] \
        if head_lr_multiplier != 1.0 else []  # the heads first: their parameters take this rate
    tiers += [(modules, lr / lr_decay ** depth, depth, {})
              for depth, modules in enumerate(layer_groups(model))]
    return discriminative_param_groups(tiers, weight_decay)


def unfreeze_to(model: nn.Module, depth: int) -> int:
    """Gradual unfreezing: train the layer groups of depth <= ``depth``; returns how many
    parameters are trainable."""
    groups = layer_groups(model)
    for index, modules in enumerate(groups):
        for module in modules:
            for parameter in module.parameters():
                parameter.requires_grad_(index <= depth)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
