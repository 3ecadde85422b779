"""The base model's fingerprint: a hash of the family and every base tensor's name and shape
(heads and pooler excluded: the adapter carries them), checked before an adapter is loaded."""

from __future__ import annotations

from torch import nn

from lmlab.utils.io import stable_hash


def base_fingerprint(model: nn.Module) -> str:
    """A short stable hash of the family and the base tensors' names and shapes."""
    return stable_hash({"family": model.config.family,
                        "tensors": sorted(f"{name}:{list(tensor.shape)}" for name, tensor
                                          in model.state_dict().items()
                                          if not name.startswith(("heads.", "pooler.")))})
