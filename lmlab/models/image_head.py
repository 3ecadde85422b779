"""ViT's image classification head: a linear map of the final-normed [CLS] state, as
transformers' ``ViTForImageClassification`` (no pooler, no dropout)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from lmlab.models.config import TransformerConfig

IMAGE_CLASSIFICATION = "image-classification"


class ImageClassificationHead(nn.Module):
    """Logits (B, num_labels) from [CLS]; the loss follows ``problem_type`` (else regression
    for one label, cross-entropy for integer labels, binary cross-entropy for multi-hot)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.num_labels = int(config.extra.get("num_labels", 2))
        self.problem_type = config.extra.get("problem_type")
        self.classifier = nn.Linear(config.hidden_size, self.num_labels)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.classifier(hidden[:, 0])  # hidden (B, 1 + patches, H): [CLS] first

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        problem = self.problem_type or (
            "regression" if self.num_labels == 1 else "single_label_classification"
            if labels.dtype in (torch.long, torch.int) else "multi_label_classification")
        if problem == "regression":
            if self.num_labels == 1:
                logits, labels = logits.squeeze(), labels.squeeze()
            return F.mse_loss(logits.float(), labels.float())
        if problem == "single_label_classification":
            return F.cross_entropy(logits.float(), labels.reshape(-1))
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float())
