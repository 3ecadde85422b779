"""Model variants that compression leaves behind, rebuilt from the config when loading: pruned
attention heads (``extra["attention_heads_per_layer"]``, ``extra["pruned_heads"]``) and
low-rank maps (``extra["low_rank"]``). How they are made is :mod:`lmlab.compress`'s business.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from lmlab.utils.errors import LmlabError

HEAD_COUNTS_KEY = "attention_heads_per_layer"
PRUNED_KEY = "pruned_heads"
LOW_RANK_KEY = "low_rank"


def _resize(attention: nn.Module, keep: list[int]) -> None:
    """Keep heads ``keep`` (current indices) of ``attention``: slice q/k/v rows, o columns."""
    hd = attention.head_dim
    rows = torch.cat([torch.arange(h * hd, (h + 1) * hd) for h in keep]) if keep else \
        torch.zeros(0, dtype=torch.long)
    for name in ("q_proj", "k_proj", "v_proj"):
        setattr(attention, name, _sliced(getattr(attention, name), rows, dim=0))
    attention.o_proj = _sliced(attention.o_proj, rows, dim=1)
    attention.num_heads = attention.num_kv_heads = len(keep)


def _sliced(linear: nn.Linear, index: torch.Tensor, dim: int) -> nn.Linear:
    """A Linear holding ``linear``'s output rows (dim 0) or input columns (dim 1) ``index``."""
    weight = linear.weight.detach().index_select(dim, index.to(linear.weight.device))
    out_features, in_features = weight.shape
    new = nn.Linear(in_features, out_features, bias=linear.bias is not None,
                    device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        new.weight.copy_(weight)
        if linear.bias is not None:
            bias = linear.bias.detach()
            new.bias.copy_(bias.index_select(0, index.to(bias.device)) if dim == 0 else bias)
            new.bias.requires_grad_(linear.bias.requires_grad)
    new.weight.requires_grad_(linear.weight.requires_grad)
    return new


def build_pruned_layout(transformer: nn.Module, counts: list[int]) -> None:
    """Give a freshly built stack the per-layer head counts ``counts`` (to load a pruned model)."""
    if len(counts) != len(transformer.layers):
        raise LmlabError(f"{HEAD_COUNTS_KEY} lists {len(counts)} layers, the model has "
                         f"{len(transformer.layers)}",
                         "check that config.json belongs to this model")
    for layer, count in zip(transformer.layers, counts):
        if not 0 < int(count) <= layer.attention.num_heads:
            raise LmlabError(f"{HEAD_COUNTS_KEY} has {count} heads for a layer of "
                             f"{layer.attention.num_heads}", "check config.json")
        _resize(layer.attention, list(range(int(count))))


class LowRankLinear(nn.Module):
    """``up(down(x))``: a rank-``rank`` stand-in for a ``Linear(in_features, out_features)``."""

    def __init__(self, in_features: int, out_features: int, rank: int, bias: bool = True,
                 device=None, dtype=None):
        super().__init__()
        self.in_features, self.out_features, self.rank = in_features, out_features, rank
        self.down = nn.Linear(in_features, rank, bias=False, device=device, dtype=dtype)
        self.up = nn.Linear(rank, out_features, bias=bias, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(self.down(x))

    def weight_product(self) -> torch.Tensor:
        """The (out, in) matrix this module applies (``up.weight @ down.weight``)."""
        return self.up.weight @ self.down.weight


def build_low_rank_layout(model: nn.Module, record: dict[str, int]) -> None:
    """Give a freshly built model the factorised shapes ``record`` names (loading a saved one)."""
    for name, rank in record.items():
        try:
            linear = model.get_submodule(name)
        except AttributeError as error:
            raise LmlabError(f"{LOW_RANK_KEY} names {name!r}, which the model lacks",
                             "check that config.json belongs to this model") from error
        parent, child = name.rsplit(".", 1)
        setattr(model.get_submodule(parent), child,
                LowRankLinear(linear.in_features, linear.out_features, int(rank),
                              bias=linear.bias is not None))


_LAYER_MAP = re.compile(r"layers\.(\d+)\.(attention|cross_attention|feed_forward)\."
                        r"(q_proj|k_proj|v_proj|o_proj|up_proj|gate_proj|down_proj)$")


def factorised_shapes(config) -> list[tuple[str, int, int, int]]:
    """(block, in_features, out_features, rank) of every map ``extra["low_rank"]`` names, from
    the config alone (pruned head counts included), for parameter and FLOP counts."""
    counts = config.extra.get("attention_heads_per_layer") or ()
    shapes = []
    for name, rank in config.extra.get(LOW_RANK_KEY, {}).items():
        found = _LAYER_MAP.search(name)
        if found is None:
            raise LmlabError(f"{LOW_RANK_KEY} names {name!r}, not a Transformer layer's "
                             "linear map", "check that config.json belongs to this model")
        layer, block, proj = int(found[1]), found[2], found[3]
        h, f, hd = config.hidden_size, config.intermediate_size, config.head_dim
        heads = int(counts[layer]) if layer < len(counts) else config.num_attention_heads
        kv_heads = heads if counts else config.num_key_value_heads
        fan_in, fan_out = {"q_proj": (h, heads * hd), "k_proj": (h, kv_heads * hd),
                           "v_proj": (h, kv_heads * hd), "o_proj": (heads * hd, h),
                           "up_proj": (h, f), "gate_proj": (h, f), "down_proj": (f, h)}[proj]
        shapes.append(("feed_forward" if block == "feed_forward" else "attention",
                       fan_in, fan_out, int(rank)))
    return shapes
