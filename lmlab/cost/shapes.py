"""How fast a model's own linear layers run on each CPU matmul path, measured on this host.

Square-matrix peaks rank the paths differently from a model's thin linear layers, so
``precision="auto"`` times the products of one training step (forward, input and weight
gradients) of every distinct ``nn.Linear`` shape, in fp32 and bf16, cached per host and shape
set (``cache_dir()/cost/linear-shapes.json``); see docs/training.md. int8 quantisation's engine
choice (:mod:`lmlab.compress.quantize`) keeps its per-shape timings in the same cache
(:func:`cached_seconds`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from lmlab.cost.peak import median_seconds, read_cache
from lmlab.utils.host import describe_host
from lmlab.utils.io import atomic_write_json
from lmlab.utils.paths import cache_dir

_CACHE_VERSION = 2  # 2: each entry records the load it was measured under
PATHS = ("fp32", "bf16")


def linear_shapes(model: nn.Module) -> Counter[tuple[int, int]]:
    """(in_features, out_features) of every ``nn.Linear`` in ``model``, with its count."""
    return Counter((m.in_features, m.out_features) for m in model.modules()
                   if isinstance(m, nn.Linear))


@dataclass(frozen=True)
class LinearTimes:
    """Seconds one training step's linear products take on each path (forward + backward)."""

    seconds: dict[str, float]
    shapes: int     # distinct (in, out) shapes timed

    def speedup(self, path: str, over: str = "fp32") -> float:
        return self.seconds[over] / self.seconds[path]


def measure_linear_times(shapes: Counter[tuple[int, int]], tokens: int,
                         reps: int = 3) -> dict[str, float]:
    """Seconds per path for one step's linear products of ``shapes`` at ``tokens`` rows."""
    totals = dict.fromkeys(PATHS, 0.0)
    with torch.no_grad():
        for (fan_in, fan_out), count in shapes.items():
            x, w, g = torch.randn(tokens, fan_in), torch.randn(fan_out, fan_in), \
                torch.randn(tokens, fan_out)
            for path in PATHS:
                dtype = torch.float32 if path == "fp32" else torch.bfloat16
                xd, wd, gd = x.to(dtype), w.to(dtype), g.to(dtype)

                def step(xd=xd, wd=wd, gd=gd) -> None:
                    torch.nn.functional.linear(xd, wd)  # forward (tokens, out)
                    gd @ wd  # input gradient (tokens, in)
                    gd.t() @ xd  # weight gradient (out, in)

                totals[path] += count * median_seconds(step, reps)
    return totals


def model_linear_times(model: nn.Module, tokens: int, refresh: bool = False,
                       measure: Callable[[Counter[tuple[int, int]], int], dict[str, float]]
                       | None = None) -> LinearTimes:
    """The model's linear products timed on each path, from the per-host cache or measured now.

    ``measure`` replaces :func:`measure_linear_times` (tests inject their own figures)."""
    shapes = linear_shapes(model)
    signature = f"{tokens}:" + ",".join(f"{i}x{o}*{n}" for (i, o), n in sorted(shapes.items()))
    seconds = cached_seconds(signature, lambda: (measure or measure_linear_times)(shapes, tokens),
                             refresh)
    return LinearTimes(seconds, len(shapes))


def cached_seconds(signature: str, measure: Callable[[], dict[str, float]],
                   refresh: bool = False) -> dict[str, float]:
    """Seconds per path of one measurement (``signature`` names what was timed), from this
    host's entry in the cache, or ``measure()`` now (then cached). An entry measured while
    other work loaded the CPU is measured again once the machine is quiet (as the peaks are)."""
    from lmlab.cost.peak import _load_average, _loaded

    host = describe_host()
    path = cache_dir() / "cost" / "linear-shapes.json"
    entry = read_cache(path, _CACHE_VERSION).get("hosts", {}).get(host, {}).get(signature)
    threads = torch.get_num_threads()
    stale = entry is not None and _loaded(entry.get("load_average"), threads) and \
        not _loaded(_load_average(), threads)
    if entry is not None and not refresh and not stale:
        return dict(entry["seconds"])
    load = _load_average()
    seconds = measure()
    data = read_cache(path, _CACHE_VERSION)  # re-read: another process may have added entries
    data.setdefault("hosts", {}).setdefault(host, {})[signature] = {"seconds": seconds,
                                                                    "load_average": load}
    data["version"] = _CACHE_VERSION
    atomic_write_json(path, data)
    return seconds
