"""Low-rank factorisation of linear layers by truncated SVD (post-training).

Each chosen ``Linear(in, out)`` becomes a :class:`~lmlab.models.variants.LowRankLinear`
(``down`` in -> r, then ``up`` r -> out): the best rank-r approximation (Eckart & Young), a
saving only when ``r < in * out / (in + out)``. The rank is given, or the smallest keeping an
``energy`` fraction of ``sum s_i^2``; the config records it so loading rebuilds the shapes
(lmlab's own format). See docs/pruning.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from lmlab.compress.settings import LowRank
from lmlab.models.variants import LOW_RANK_KEY, LowRankLinear
from lmlab.utils.errors import LmlabError


@dataclass
class Factorised:
    """What factorising one module changed."""

    name: str
    in_features: int
    out_features: int
    rank: int
    parameters_before: int
    parameters_after: int
    relative_error: float  # ||W - W_r||_F / ||W||_F
    energy: float  # fraction of sum s_i^2 kept

    def to_dict(self) -> dict:
        return asdict(self)


def rank_for_energy(singular_values: torch.Tensor, energy: float) -> int:
    """The smallest rank whose singular values hold ``energy`` of ``sum s_i^2``."""
    LowRank(energy=energy)  # the checks
    squares = singular_values.double() ** 2
    cumulative = torch.cumsum(squares, 0) / squares.sum()
    return min(int((cumulative < energy - 1e-12).sum()) + 1, len(singular_values))


def factorise(linear: nn.Linear, rank: int | None = None, energy: float | None = None
              ) -> tuple[LowRankLinear, float, float]:
    """(the rank-r module, relative Frobenius error, energy kept) for ``linear``."""
    LowRank(rank, energy)  # the checks
    weight = linear.weight.detach()
    u, s, vh = torch.linalg.svd(weight.double(), full_matrices=False)  # (out, k), (k,), (k, in)
    if rank is None:
        rank = rank_for_energy(s, energy)
    if not 1 <= rank <= len(s):
        raise LmlabError(f"rank {rank} for a {tuple(weight.shape)} matrix",
                         f"use a rank from 1 to {len(s)}")
    root = s[:rank].sqrt()
    module = LowRankLinear(linear.in_features, linear.out_features, rank,
                           bias=linear.bias is not None, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        module.down.weight.copy_(root[:, None] * vh[:rank])  # (r, in)
        module.up.weight.copy_(u[:, :rank] * root[None, :])  # (out, r)
        if linear.bias is not None:
            module.up.bias.copy_(linear.bias.detach())
    total = float((s ** 2).sum())
    kept = float((s[:rank] ** 2).sum())
    error = (max(total - kept, 0.0) / total) ** 0.5 if total > 0 else 0.0
    return module, error, kept / total if total > 0 else 1.0


def select_linears(model: nn.Module, modules: list[str] | None = None) -> dict[str, nn.Linear]:
    """The layers' linear maps named by ``modules`` (names or name endings; default all),
    refusing names that match none (callers check this before any work)."""
    from lmlab.compress.magnitude import prunable_linears

    linears = prunable_linears(model)
    if modules:
        chosen = {n: m for n, m in linears.items()
                  if any(n == key or n.endswith("." + key) for key in modules)}
        if not chosen:
            raise LmlabError(f"no linear layer matches {modules}",
                             "name modules such as q_proj, o_proj, up_proj, down_proj")
        linears = chosen
    return linears


def low_rank(model: nn.Module, rank: int | None = None, energy: float | None = None,
             modules: list[str] | None = None, only_if_smaller: bool = True
             ) -> list[Factorised]:
    """Factorise the Transformer layers' linear maps of ``model`` in place.

    Args:
        rank: one rank for every matrix (capped at its smaller side), or
        energy: per matrix, the smallest rank keeping this fraction of ``sum s_i^2``.
        modules: names (or name endings, e.g. ``"up_proj"``) to factorise; default all.
        only_if_smaller: leave a matrix whole when the rank would not save weights.

    Returns one :class:`Factorised` row per factorised module; the config records them.
    """
    LowRank(rank, energy)  # the checks, before any work
    linears = select_linears(model, modules)
    rows = []
    record = dict(model.config.extra.get(LOW_RANK_KEY, {}))
    for name, linear in linears.items():
        limit = min(linear.in_features, linear.out_features)
        module, error, kept = factorise(linear, rank=min(rank, limit) if rank else None,
                                        energy=energy)
        before = linear.weight.numel()
        after = module.rank * (linear.in_features + linear.out_features)
        if only_if_smaller and after >= before:
            continue
        parent, child = name.rsplit(".", 1)
        setattr(model.get_submodule(parent), child, module)
        record[name] = module.rank
        rows.append(Factorised(name, linear.in_features, linear.out_features, module.rank,
                               before, after, error, kept))
    model.config.extra[LOW_RANK_KEY] = record
    return rows


def summary(rows: list[Factorised], model: nn.Module) -> dict:
    """Parameters and per-token multiply-adds of the factorised matrices, before and after."""
    from lmlab.models.model import count_parameters

    before = sum(r.parameters_before for r in rows)
    after = sum(r.parameters_after for r in rows)
    return {"modules": len(rows), "matrix_weights_before": before,
            "matrix_weights_after": after,
            "matrix_flops_fraction_removed": 1 - after / before if before else 0.0,
            "model_parameters": count_parameters(model),
            "max_relative_error": max((r.relative_error for r in rows), default=0.0)}
