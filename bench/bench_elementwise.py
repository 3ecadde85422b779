"""The element-wise part of a training step on the CPU, in eager mode: fused alternatives.

A bert-shaped model (``--size``: mini 4 x 256, small 4 x 512, base 12 x 768) spends 28-37% of a
training step outside its matrix products (GELU, dropout, norms, the optimizer). Each group
below times what lmlab's Trainer and models run now against the fused alternatives eager torch
offers on the CPU, sides alternated, medians, with the largest difference of their results
(the numerics a switch would change):

- ``adamw``: one AdamW step over the model's parameters (random gradients, two param groups as
  the Trainer builds them): the per-tensor loop (torch's CPU default, what the Trainer gets),
  ``foreach=True`` (multi-tensor ops) and ``fused=True`` (one kernel per tensor);
- ``bias-gelu``: the FFN's up projection and GELU, forward and backward, on B x T tokens:
  ``nn.Linear`` then ``nn.GELU`` (the models), ``F.gelu(torch.addmm(b, x, W.T))`` (bias folded
  in the product, one call), and the product without bias plus a separate ``bias + GELU``;
- ``layer-norm``: the residual add and post-norm ``LayerNorm(x + h)``, forward and backward:
  ``F.layer_norm`` on the sum (the models) and a composite (mean, var, rsqrt) for reference;
- ``dropout``: ``F.dropout`` at p=0.1, forward and backward, against a Bernoulli mask multiply.

Usage:
    python bench/bench_elementwise.py --size base --reps 7
    python bench/bench_elementwise.py --size mini --reps 2   # a quick check that it runs
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import alternate, print_json  # noqa: E402

SIZES = {"mini": (4, 256, 32, 128), "small": (4, 512, 32, 128), "base": (12, 768, 8, 128)}


def timed(fn: Callable[[], object]) -> Callable[[], float]:
    """A side for :func:`alternate`: calls per second of ``fn``."""
    def run() -> float:
        start = time.perf_counter()
        fn()
        return 1.0 / (time.perf_counter() - start)
    return run


def compare(sides: dict[str, Callable[[], torch.Tensor]], reps: int) -> dict:
    """Alternate the sides; medians (ms), speed-up over the first side and each side's largest
    difference from the first side's result."""
    results = {name: fn() for name, fn in sides.items()}  # warm-up, and the numerics
    first = next(iter(results.values()))
    measured = alternate({name: timed(fn) for name, fn in sides.items()}, reps)
    base = measured[next(iter(sides))]["median"]
    return {name: {"ms": round(1e3 / m["median"], 3), "speedup": round(m["median"] / base, 2),
                   "max_abs_diff": float((results[name] - first).abs().max())}
            for name, m in measured.items()}


def adamw(layers: int, hidden: int, reps: int) -> dict:
    from lmlab.models.config import TransformerConfig
    from lmlab.models.model import LanguageModel
    from lmlab.training.optim import param_groups

    torch.manual_seed(0)
    model = LanguageModel(TransformerConfig(hidden_size=hidden, num_hidden_layers=layers,
                                            num_attention_heads=hidden // 64,
                                            intermediate_size=4 * hidden))
    start = [p.detach().clone() for p in model.parameters()]
    grads = [torch.randn_like(p) * 1e-3 for p in model.parameters()]
    optimizers = {}
    for name, flags in (("for-loop (Trainer)", {"foreach": False}),
                        ("foreach", {"foreach": True}), ("fused", {"fused": True})):
        params = [nn.Parameter(p.clone()) for p in start]
        holder = nn.ParameterList(params)
        for p, g in zip(params, grads):
            p.grad = g.clone()
        lookup = dict(zip(model.parameters(), params))  # the Trainer's groups, on the copies
        groups = [{**g, "params": [lookup[p] for p in g["params"]]}
                  for g in param_groups([model], 0.01)]
        optimizers[name] = (torch.optim.AdamW(groups, lr=1e-4, weight_decay=0.01, **flags),
                            holder)

    def step(name: str) -> Callable[[], torch.Tensor]:
        optimizer, holder = optimizers[name]

        def run() -> torch.Tensor:
            optimizer.step()
            return holder[0].detach()
        return run

    sides = {name: step(name) for name in optimizers}
    out = compare(sides, reps)
    return {"parameters_m": round(sum(p.numel() for p in start) / 1e6, 1), "sides": out}


def bias_gelu(hidden: int, tokens: int, reps: int) -> dict:
    torch.manual_seed(0)
    linear, gelu = nn.Linear(hidden, 4 * hidden), nn.GELU()
    x = torch.randn(tokens, hidden, requires_grad=True)
    grad = torch.randn(tokens, 4 * hidden)

    def backward(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            x.grad = linear.weight.grad = linear.bias.grad = None
            fn().backward(grad)
            return linear.weight.grad
        return run

    sides = {"Linear + GELU (models)": backward(lambda: gelu(linear(x))),
             "gelu(addmm)": backward(lambda: F.gelu(torch.addmm(linear.bias, x,
                                                                 linear.weight.t()))),
             "mm, then bias + gelu": backward(lambda: F.gelu(x @ linear.weight.t()
                                                             + linear.bias))}
    return compare(sides, reps)


def layer_norm(hidden: int, tokens: int, reps: int) -> dict:
    torch.manual_seed(0)
    norm = nn.LayerNorm(hidden, eps=1e-12)
    x = torch.randn(tokens, hidden, requires_grad=True)
    h = torch.randn(tokens, hidden, requires_grad=True)
    grad = torch.randn(tokens, hidden)

    def composite(y: torch.Tensor) -> torch.Tensor:
        mean = y.mean(-1, keepdim=True)
        var = (y - mean).pow(2).mean(-1, keepdim=True)
        return (y - mean) * torch.rsqrt(var + norm.eps) * norm.weight + norm.bias

    def backward(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            x.grad = h.grad = norm.weight.grad = None
            fn().backward(grad)
            return x.grad
        return run

    sides = {"F.layer_norm(x + h) (models)": backward(lambda: F.layer_norm(
                 x + h, (hidden,), norm.weight, norm.bias, norm.eps)),
             "composite": backward(lambda: composite(x + h))}
    return compare(sides, reps)


def dropout(hidden: int, tokens: int, reps: int) -> dict:
    x = torch.randn(tokens, 4 * hidden, requires_grad=True)
    grad = torch.randn(tokens, 4 * hidden)

    def backward(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            torch.manual_seed(0)
            x.grad = None
            fn().backward(grad)
            return (x.grad != 0).float()  # the kept positions differ by generator use
        return run

    sides = {"F.dropout (models)": backward(lambda: F.dropout(x, 0.1, True)),
             "bernoulli mask": backward(
                 lambda: x * (torch.empty_like(x).bernoulli_(0.9) / 0.9))}
    out = compare(sides, reps)
    for side in out.values():
        side.pop("max_abs_diff")  # random masks: no common result to compare
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=SIZES, default="base")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--out", type=Path, help="also write the result as JSON here")
    args = parser.parse_args()
    from lmlab.utils.host import describe_host

    layers, hidden, batch, seq = SIZES[args.size]
    tokens = batch * seq
    result = {"host": describe_host(), "size": f"{layers} x {hidden}, {batch} x {seq} tokens",
              "adamw": adamw(layers, hidden, args.reps),
              "bias_gelu": bias_gelu(hidden, tokens, args.reps),
              "layer_norm": layer_norm(hidden, tokens, args.reps),
              "dropout": dropout(hidden, tokens, args.reps)}
    print_json(result)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
