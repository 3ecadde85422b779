"""Fine-tuning recipes: BERT's, ULMFiT's and the feature-based (ELMo-style) one.

* ``bert`` (Devlin et al. 2019): AdamW, lr in 2e-5..5e-5, 2-4 epochs, 10% linear warmup then
  linear decay, batch 16-32, every weight trained.
* ``ulmfit`` (Howard & Ruder 2018): discriminative learning rates (layer group at depth d from
  the top gets ``lr / 2.6**d``), gradual unfreezing (epoch k trains the top k+1 groups), slanted
  triangular learning rates (cut_frac 0.1, ratio 32), concat pooling ``[last, max, mean]``.
* ``feature`` (Peters et al. 2018; the BERT paper's feature-based comparison): the encoder is
  frozen; only a head over a chosen layer, or over a learned scalar mix of all layers
  (``gamma * sum_j softmax(w)_j h_j``), is trained. A finished run is saved and loaded as one
  :class:`FeatureClassifier` (the encoder's folder plus ``feature_head.safetensors``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
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


def pooled_layer_states(model: nn.Module, batch: dict[str, torch.Tensor],
                        pooling: str) -> torch.Tensor:
    """Sentence vectors of every hidden state (embeddings + each layer): (B, L+1, H) in fp32.
    ``pooling`` ``mean`` (over real tokens) or ``cls`` (first token)."""
    from lmlab.finetune.heads import masked_mean

    out = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"),
                token_type_ids=batch.get("token_type_ids"), heads=[],
                output_hidden_states=True)
    states = torch.stack(out.hidden_states, dim=1).float()  # (B, L+1, T, H)
    if pooling == "cls":
        return states[:, :, 0]  # (B, L+1, H)
    mask = batch.get("attention_mask")
    if mask is None:
        return states.mean(2)
    mask = mask[:, None, :].expand(-1, states.shape[1], -1)  # (B, L+1, T)
    pooled = masked_mean(states.flatten(0, 1), mask.flatten(0, 1))  # (B*(L+1), H)
    return pooled.view(states.shape[0], states.shape[1], -1)  # (B, L+1, H)


@torch.no_grad()
def layer_features(model: nn.Module, batches, pooling: str = "mean",
                   precision: str = "fp32") -> tuple[list[int], torch.Tensor]:
    """Per-layer sentence vectors of a frozen encoder: (N, L+1, H) in the order of ``batches``'
    indices. ``pooling`` ``mean`` (real tokens) or ``cls`` (first token)."""
    model.eval()
    order: list[int] = []
    chunks = []
    for indices, batch in batches:
        with precision_autocast(precision, "cpu"):
            chunks.append(pooled_layer_states(model, batch, pooling))
        order += list(indices)
    features = torch.cat(chunks)
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.tensor(order)] = torch.arange(len(order))
    return sorted(order), features[inverse]


# -- a finished feature-based run as one model ----------------------------------------------------
FEATURE_HEAD_WEIGHTS = "feature_head.safetensors"
FEATURE_HEAD_CONFIG = "feature_head.json"


class FeatureClassifier(nn.Module):
    """A feature-based run as one model: the frozen ``encoder`` (a LanguageModel without heads)
    gives per-layer sentence vectors, its :class:`FeatureHead` classifies them.

    It answers where a model with a ``sequence-classification`` head is expected (``heads``,
    ``config.extra["num_labels"/"id2label"]``, :func:`lmlab.finetune.heads.task_logits`), so
    ``lmlab evaluate``, ``lmlab.from_pretrained`` and the text-classification pipeline take a
    feature run like any other. Saved as a Hugging Face folder of the bare encoder (transformers
    reads it as ``AutoModel``) plus ``feature_head.safetensors`` and ``feature_head.json``.
    Like :func:`~lmlab.finetune.heads.add_task_head`, it records ``num_labels`` and
    ``id2label`` in the encoder's ``config.extra``.
    """

    def __init__(self, encoder: nn.Module, head: FeatureHead, pooling: str,
                 labels: list[str], max_length: int = 128):
        from lmlab.finetune.heads import SEQUENCE_CLASSIFICATION

        super().__init__()
        if encoder.heads:
            raise LmlabError(f"the encoder of a feature classifier must have no heads, not "
                             f"{', '.join(encoder.heads)}", "delete them first")
        if pooling not in ("mean", "cls"):
            raise LmlabError(f"unknown feature pooling {pooling!r}", "use mean or cls")
        self.encoder = encoder
        self.heads = nn.ModuleDict({SEQUENCE_CLASSIFICATION: head})
        self.pooling = pooling
        self.labels = list(labels)
        self.max_length = max_length
        outputs = head.classifier.out_features
        encoder.config.extra["num_labels"] = outputs
        if self.labels and outputs == len(self.labels):
            encoder.config.extra["id2label"] = dict(enumerate(self.labels))

    @property
    def config(self):
        return self.encoder.config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, num_labels): the head runs in fp32 on fp32 features, as in training."""
        batch = {"input_ids": input_ids, "attention_mask": attention_mask,
                 "token_type_ids": token_type_ids}
        features = pooled_layer_states(self.encoder, batch, self.pooling)  # (B, L+1, H)
        head = next(iter(self.heads.values()))
        with torch.autocast(features.device.type, enabled=False):
            return head(features.to(head.classifier.weight.dtype))

    def save_pretrained(self, path: str | Path) -> Path:
        """The encoder's Hugging Face folder plus the head's weights and settings."""
        from safetensors.torch import save_file

        from lmlab.utils.io import atomic_path, atomic_write_json

        path = Path(path)
        self.encoder.save_pretrained(path)
        head = next(iter(self.heads.values()))
        with atomic_path(path / FEATURE_HEAD_WEIGHTS) as tmp:
            save_file({k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()},
                      str(tmp))
        layers = head.mix.weights.numel() if head.mix is not None else None
        atomic_write_json(path / FEATURE_HEAD_CONFIG, {
            "layers": layers or self.config.num_hidden_layers + 1,
            "hidden": head.classifier.in_features, "outputs": head.classifier.out_features,
            "layer": head.layer, "pooling": self.pooling, "labels": self.labels,
            "max_length": self.max_length})
        return path


def is_feature_run(path: str | Path) -> bool:
    """Whether ``path`` (a model folder) holds a feature-based run's head."""
    return (Path(path) / FEATURE_HEAD_CONFIG).exists()


def load_feature_classifier(path: str | Path, head: str | list[str] | None = None,
                            dtype: torch.dtype | None = None) -> FeatureClassifier:
    """Load a feature-based run's model folder (what :meth:`FeatureClassifier.save_pretrained`
    wrote) in eval mode; ``dtype`` casts the encoder only (the head is tiny and stays fp32)."""
    import json

    from safetensors.torch import load_file

    from lmlab.finetune.heads import SEQUENCE_CLASSIFICATION
    from lmlab.interop.hf import load_pretrained

    path = Path(path)
    asked = [head] if isinstance(head, str) else list(head or [])
    if any(name != SEQUENCE_CLASSIFICATION for name in asked):
        raise LmlabError(f"{path} is a feature-based run: its only head is "
                         f"{SEQUENCE_CLASSIFICATION!r}, not {', '.join(asked)}",
                         "use it for text classification (or regression), or fine-tune a "
                         "model with that head")
    if not (path / "config.json").exists():
        raise LmlabError(f"{path} is a feature-based run saved without its encoder (by an "
                         "older lmlab)", "fine-tune it again with `lmlab finetune --recipe "
                         "feature`: runs now keep the encoder beside the head")
    with open(path / FEATURE_HEAD_CONFIG, encoding="utf-8") as handle:
        settings = json.load(handle)
    encoder = load_pretrained(path, head=[], dtype=dtype)
    feature_head = FeatureHead(settings["layers"], settings["hidden"], settings["outputs"],
                               settings["layer"])
    feature_head.load_state_dict(load_file(str(path / FEATURE_HEAD_WEIGHTS)))
    model = FeatureClassifier(encoder, feature_head, settings["pooling"], settings["labels"],
                              settings.get("max_length", 128))
    return model.eval()
