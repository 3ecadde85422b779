"""The base model's fingerprint: which checkpoint shape an adapter was trained on.

An adapter holds deltas or extra modules for named tensors of one architecture; loaded on
another it either fails deep inside a forward pass or, worse, runs and computes nonsense. The
fingerprint is a hash of the family and of every base tensor's name and shape (the task heads
and the pooler, which the adapter file carries itself, excluded: a head that reads the pooled
vector adds a freshly initialised pooler to a base that has none), taken before the method is
applied and checked before one is loaded.
"""

from __future__ import annotations

from torch import nn

from lmlab.utils.io import stable_hash


def base_tensors(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Name -> shape of the base model's parameters and persistent buffers, heads and pooler
    excluded."""
    return {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()
            if not name.startswith(("heads.", "pooler."))}


def base_fingerprint(model: nn.Module) -> str:
    """A short stable hash of the family and the base tensors' names and shapes."""
    return stable_hash({"family": model.config.family,
                        "tensors": sorted(f"{n}:{list(s)}" for n, s in
                                          base_tensors(model).items())})
