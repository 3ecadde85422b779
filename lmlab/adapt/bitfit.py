"""BitFit (Ben Zaken et al. 2022, "BitFit: Simple Parameter-efficient Fine-tuning for
Transformer-based Masked Language-models"): train only the bias terms of the body (with the
task head); every weight matrix, embedding and norm scale stays frozen. Nothing is added.
"""

from __future__ import annotations

from torch import nn

from lmlab.utils.errors import LmlabError


def bias_names(model: nn.Module) -> list[str]:
    """Names of the body's bias parameters (norm biases included, as in the paper)."""
    return [name for name, _ in model.named_parameters()
            if name.startswith("transformer.") and name.endswith(".bias")]


def check_has_biases(model: nn.Module) -> list[str]:
    names = bias_names(model)
    if not names:
        raise LmlabError(f"this {model.config.family} model has no bias terms, so BitFit has "
                         "nothing to train", "use --method lora or adapter on it")
    return names
