"""Shared helpers for side-by-side benchmarks: timing, medians, interference, environment."""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import time
from collections.abc import Callable


def rss_kib(field: str) -> int:
    """A memory figure of this process from ``/proc/self/status`` (``VmRSS``: resident now,
    ``VmHWM``: its peak), in KiB."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def peak_rss_mib() -> float:
    """This process's peak resident set (``VmHWM``), in MiB. Not ``ru_maxrss``: Linux keeps the
    parent's peak in it across fork + exec, so every child of a large parent would report at
    least the parent's peak."""
    return rss_kib("VmHWM") / 1024


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def environment() -> dict:
    import torch

    info = {"cpu": cpu_model(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(),
            "GLIBC_TUNABLES": os.environ.get("GLIBC_TUNABLES", "")}
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    return info


def other_cpu_seconds() -> float:
    """CPU seconds used by every process on the machine (from /proc/stat), minus ours: a
    measure of interference during a repetition."""
    with open("/proc/stat") as handle:
        fields = handle.readline().split()[1:]
    user, nice, system = (int(x) for x in fields[:3])
    total = (user + nice + system) / os.sysconf("SC_CLK_TCK")
    own = resource.getrusage(resource.RUSAGE_SELF)
    return total - (own.ru_utime + own.ru_stime)


def alternate(sides: dict[str, Callable[[], float]], repetitions: int) -> dict[str, dict]:
    """Run each side once per repetition, alternating (A B A B ...); each call returns a
    throughput. Returns per side the values, the median and the interference per rep."""
    results = {name: {"values": [], "interference_s": []} for name in sides}
    for _ in range(repetitions):
        for name, run in sides.items():
            before_other, start = other_cpu_seconds(), time.perf_counter()
            value = run()
            elapsed = time.perf_counter() - start
            results[name]["values"].append(value)
            results[name]["interference_s"].append(
                round((other_cpu_seconds() - before_other) / max(elapsed, 1e-9), 2))
    for entry in results.values():
        entry["median"] = statistics.median(entry["values"])
    return results


def print_json(obj) -> None:
    print(json.dumps(obj, indent=2, default=str))
