"""BitFit (Ben Zaken et al. 2022): train only the body's bias terms (with the task head)."""

from __future__ import annotations

from torch import nn

from lmlab.utils.errors import LmlabError


def train_biases(model: nn.Module, settings: None = None) -> list[str]:
    """BitFit's surgery: none; the names of the body's bias parameters, which train (norm
    biases included, as in the paper). A model without any is refused."""
    names = [name for name, _ in model.named_parameters()
             if name.startswith("transformer.") and name.endswith(".bias")]
    if not names:
        raise LmlabError(f"this {model.config.family} model has no bias terms, so BitFit has "
                         "nothing to train", "use --method lora or adapter on it")
    return names
