"""Peak matmul throughput of a device: measured on this CPU (cached), looked up for GPUs.

MFU's denominator must be named: on CPUs one precision runs at very different rates on
different library paths, so each path (``fp32``: torch.matmul/MKL, ``fp32-onednn``, ``bf16``)
is timed on square products and cached per host (``cache_dir()/cost/peaks.json``). GPU peaks
are the data sheets' dense figures (:data:`GPU_SPECS`). Method and measurements: docs/cost.md
("Peaks: the MFU denominator").
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmlab.cost.facts import facts
from lmlab.utils.checks import check_choice
from lmlab.utils.errors import LmlabError
from lmlab.utils.host import cpu_name, describe_host
from lmlab.utils.io import atomic_write_json, read_json
from lmlab.utils.paths import cache_dir

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
_CACHE_VERSION = 1


@dataclass(frozen=True)
class GpuSpec:
    """Data-sheet figures of one GPU model. Peaks in FLOP/s (dense), power in watts."""

    name: str
    peaks: dict[str, float]
    tdp_watts: float
    source: str


# data-sheet figures (dense; GeForce fp16/bf16 with fp32 accumulation): lmlab/cost/facts.json
GPU_SPECS: dict[str, GpuSpec] = {key: GpuSpec(**spec) for key, spec in facts()["gpus"].items()}


def gpu_key_from_name(device_name: str) -> str | None:
    """Map a CUDA device name (``torch.cuda.get_device_name()``) to a :data:`GPU_SPECS` key."""
    name = device_name.lower().replace(" ", "")
    for key, needle in (("h200", "h200"), ("h100-pcie", "h100pcie"), ("h100", "h100"),
                        ("a100", "a100"), ("v100-pcie", "v100-pcie"), ("v100", "v100"),
                        ("rtx4090", "4090"), ("rtx3090", "3090"), ("t4", "teslat4"),
                        ("p100", "p100")):
        if needle in name:
            return key
    if name.endswith("t4") or "nvidiat4" in name:
        return "t4"
    return None


def gpu_spec(device: str) -> GpuSpec:
    """The :class:`GpuSpec` of a table key (``"v100"``), a CUDA device name, or ``"cuda"`` /
    ``"cuda:N"`` (the name of that GPU is read from torch)."""
    if device.lower().startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise LmlabError(f"device {device!r}: torch sees no CUDA GPU on this machine",
                             f"name the GPU model instead: {', '.join(GPU_SPECS)}")
        device = torch.cuda.get_device_name(int(device.split(":", 1)[1]) if ":" in device else 0)
    key = device.strip().lower()
    if key not in GPU_SPECS:
        key = gpu_key_from_name(device) or key
    if key not in GPU_SPECS:
        raise LmlabError(f"no peak figures for device {device!r}",
                         f"use one of: cpu, {', '.join(GPU_SPECS)}, or pass the peak yourself")
    return GPU_SPECS[key]


# ----------------------------------------------------------------------------- CPU measurement


@dataclass
class CpuPeaks:
    """Measured peak FLOP/s of this CPU per path (see the module docstring)."""

    key: str
    cpu_model: str
    threads: int
    torch_version: str
    peaks: dict[str, float]  # path -> FLOP/s
    sizes: list[int] = field(default_factory=list)
    measured_at: str = ""
    load_average: float | None = None  # 1-min load when measured: other work lowers the peak

    @property
    def measured_under_load(self) -> bool:
        """True when other processes kept the CPU busy while measuring (peaks read low)."""
        return _loaded(self.load_average, self.threads)

    def peak(self, precision: str, path: str = "default") -> tuple[float, str]:
        """(FLOP/s, label) for a precision; ``path="best"`` takes the fastest path for it."""
        check_choice(precision, PRECISIONS, "precision", "precision")
        if precision in ("fp32", "tf32"):  # no tf32 on CPUs: it runs as fp32
            candidates = ["fp32", "fp32-onednn"] if path == "best" else ["fp32"]
        else:  # bf16, fp16
            candidates = ["bf16"]
        found = [(self.peaks[c], c) for c in candidates if c in self.peaks]
        if not found:
            raise LmlabError(f"no measured CPU peak for {precision} on this machine",
                             "run `lmlab cost peak --refresh`")
        value, which = max(found)
        label = (f"cpu {which} ({PATH_LABELS[which]}, measured {value / 1e9:,.0f} GFLOP/s, "
                 f"{self.threads} threads)")
        return value, label


PATH_LABELS = {  # what each measured path runs (CpuPeaks labels, `lmlab cost peak`)
    "fp32": "torch.matmul fp32, MKL on x86",
    "fp32-onednn": "oneDNN mkldnn_linear fp32",
    "bf16": "torch.matmul bf16",
}


def median_seconds(fn: Callable[[], Any], reps: int) -> float:
    """Median wall time of ``reps`` calls of ``fn`` after one untimed warm-up call."""
    fn()  # warm-up: allocations, kernel selection, weight reordering
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2]


PROBE_SIZE = 512
MAX_SECONDS_PER_PRODUCT = 1.0  # a path slower than this at a size is not timed at that size


def measure_cpu_peaks(sizes: Sequence[int] = (2048, 3072), reps: int = 3) -> dict[str, float]:
    """Time each matmul path on square n x n products (``2·n³`` FLOPs); FLOP/s per path (best
    median). Each path is probed at :data:`PROBE_SIZE` first and skips the sizes at which one
    product would take over :data:`MAX_SECONDS_PER_PRODUCT` (emulated bf16)."""
    import torch

    onednn = getattr(torch._C._nn, "mkldnn_linear", None)
    has_onednn = onednn is not None and torch.backends.mkldnn.is_available()

    def paths(n: int) -> dict[str, Callable[[], Any]]:
        a, b = torch.randn(n, n), torch.randn(n, n)
        runs: dict[str, Callable[[], Any]] = {"fp32": lambda: torch.matmul(a, b)}
        if has_onednn:
            a_dnnl, b_dnnl = a.to_mkldnn(), b.to_mkldnn()
            runs["fp32-onednn"] = lambda: onednn(a_dnnl, b_dnnl, None)
        a16, b16 = a.bfloat16(), b.bfloat16()
        runs["bf16"] = lambda: torch.matmul(a16, b16)
        return runs

    results: dict[str, float] = {}
    with torch.no_grad():
        for path, fn in paths(PROBE_SIZE).items():
            try:
                results[path] = 2.0 * PROBE_SIZE ** 3 / median_seconds(fn, 1)
            except RuntimeError:  # a path this build cannot run
                continue
        for n in sizes:
            for path, fn in paths(n).items():
                if path not in results or 2.0 * n ** 3 / results[path] > MAX_SECONDS_PER_PRODUCT:
                    continue
                rate = 2.0 * n ** 3 / median_seconds(fn, reps)
                results[path] = max(results[path], rate)
    return results


def read_cache(path: Path, version: int = _CACHE_VERSION) -> dict[str, Any]:
    """A per-host measurement cache, or {} when missing, unreadable or of another version."""
    try:
        data = read_json(path)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != version:
        return {}
    return data


def cpu_peaks(refresh: bool = False, measure: bool = True,
              sizes: Sequence[int] = (2048, 3072), reps: int = 3) -> CpuPeaks | None:
    """This machine's measured CPU peaks, from the cache or measured now (and cached):
    ``refresh`` measures again; ``measure=False`` returns None where nothing is cached."""
    import torch

    path = cache_dir() / "cost" / "peaks.json"
    key = describe_host()  # the host line every report prints: CPU, ISA, threads, torch
    data = read_cache(path)
    entry = data.get("machines", {}).get(key)
    threads = torch.get_num_threads()
    # A peak measured while other work loaded the machine is too low (and MFU against it too
    # high): measure again once the machine is quiet, keeping the best figure of each path.
    stale = (entry is not None and measure and _loaded(entry.get("load_average"), threads)
             and not _loaded(_load_average(), threads))
    if entry is None or refresh or stale:
        if not measure:
            return None
        load_before = _load_average()
        peaks = measure_cpu_peaks(sizes=sizes, reps=reps)
        if stale and not refresh:
            peaks = {k: max(v, float(entry["peaks"].get(k, 0.0))) for k, v in peaks.items()}
        entry = {
            "load_average": load_before,
            "cpu_model": cpu_name(), "threads": threads,
            "torch_version": torch.__version__, "peaks": peaks, "sizes": list(sizes),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        data = read_cache(path)  # re-read: another process may have added its machine
        data.setdefault("machines", {})[key] = entry
        data["version"] = _CACHE_VERSION
        atomic_write_json(path, data)
    return CpuPeaks(key=key, **entry)  # a cache entry holds every other field


def _loaded(load_average: float | None, threads: int) -> bool:
    """Whether a 1-minute load average means other work competed for the measured threads."""
    return load_average is not None and load_average > 0.5 * threads


def _load_average() -> float | None:
    """The 1-minute load average before measuring (None where the OS has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def device_peak(device: str, precision: str, path: str = "default",
                measure: bool = True) -> tuple[float, str] | None:
    """(peak FLOP/s per device, label naming the denominator) for a device and precision.

    ``device`` is ``"cpu"``, a :data:`GPU_SPECS` key, ``"cuda"``/``"cuda:N"`` (the name is read
    from torch) or a CUDA device name. For the CPU, ``path="best"`` uses the fastest measured
    path of the precision; returns None only if ``measure`` is False and nothing is cached.
    """
    precision = check_choice(precision.lower(), PRECISIONS, "precision", "precision")
    if device.lower() == "cpu":
        peaks = cpu_peaks(measure=measure)
        return None if peaks is None else peaks.peak(precision, path)
    spec = gpu_spec(device)
    if precision not in spec.peaks:
        raise LmlabError(f"{spec.name} has no {precision} figure",
                         f"use one of: {', '.join(spec.peaks)}")
    value = spec.peaks[precision]
    return value, f"{spec.name} {precision} data-sheet peak {value / 1e12:,.1f} TFLOP/s dense"


def default_threads() -> int:
    """Threads torch will use (``OMP_NUM_THREADS`` if set, else the CPU count)."""
    env = os.environ.get("OMP_NUM_THREADS")
    return int(env) if env and env.isdigit() else (os.cpu_count() or 1)
