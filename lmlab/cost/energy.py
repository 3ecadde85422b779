"""Energy a run used: measured by RAPL or NVML where the machine lets us, else estimated.

``EnergyMeter(device).start()`` ... ``.stop()`` gives joules and the method: ``rapl`` (CPU
package and DRAM counters under /sys/class/powercap, wraps added back, so long runs must
:meth:`~EnergyMeter.poll`), ``nvml`` (CUDA, through the optional ``pynvml``) or ``estimate``
(power x time, labelled as such). No method includes the data centre's PUE. Details and the
estimate's figures: docs/cost.md ("Energy").
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from lmlab.cost.facts import facts
from lmlab.cost.peak import gpu_spec
from lmlab.utils.checks import check_choice
from lmlab.utils.errors import LmlabError

DEFAULT_CPU_WATTS_PER_CORE: float = facts()["cpu_watts_per_core"]["value"]  # TDP share of a core
METHODS = ("auto", "rapl", "nvml", "estimate")
RAPL_ROOT = "/sys/class/powercap"
_TOP_ZONE = re.compile(r"^intel-rapl:\d+$")
_SUB_ZONE = re.compile(r"^intel-rapl:\d+:\d+$")


class EnergyReading(NamedTuple):
    """Energy in joules and how it was obtained (``"rapl ..."``, ``"nvml"``, ``"estimate ..."``)."""

    joules: float
    method: str

    @property
    def is_estimate(self) -> bool:
        return self.method.startswith("estimate")


# ---------------------------------------------------------------------------------------- RAPL


@dataclass(frozen=True)
class RaplZone:
    """One RAPL counter: ``path`` holds ``energy_uj`` and ``max_energy_range_uj``."""

    name: str
    path: Path
    max_range_uj: int

    def read_uj(self) -> int:
        return int((self.path / "energy_uj").read_text().strip())


def rapl_zones(root: str | os.PathLike = RAPL_ROOT) -> list[RaplZone]:
    """The readable package (``intel-rapl:N`` named ``package-*``) and DRAM (sub-zones named
    ``dram``, not in the package's count) counters under ``root``; ``psys`` zones already
    contain the packages and are skipped."""
    root = Path(root)
    zones: list[RaplZone] = []
    if not root.is_dir():
        return zones
    candidates = sorted(root.glob("intel-rapl:*")) + sorted(root.glob("intel-rapl:*/intel-rapl:*"))
    seen: set[Path] = set()
    for path in candidates:
        real = path.resolve()
        if real in seen:
            continue
        seen.add(real)
        try:
            name = (path / "name").read_text().strip()
            max_range = int((path / "max_energy_range_uj").read_text().strip())
            int((path / "energy_uj").read_text().strip())  # readable? (root-only on many hosts)
        except (OSError, ValueError):
            continue
        top = _TOP_ZONE.match(path.name) and name.startswith("package")
        dram = _SUB_ZONE.match(path.name) and name == "dram"
        if top or dram:
            zones.append(RaplZone(name=name, path=path, max_range_uj=max_range))
    return zones


def counter_delta(start: int, end: int, max_range: int) -> int:
    """Increase of a wrapping counter from ``start`` to ``end`` (at most one wrap between)."""
    if end >= start:
        return end - start
    return end + max_range - start


# ---------------------------------------------------------------------------------------- NVML


def _nvml_counters(indices: list[int]) -> Callable[[], list[int]] | None:
    """A reader of the GPUs' energy counters (mJ since the driver loaded), or None when
    pynvml/NVML is not usable."""
    try:
        import pynvml  # optional dependency
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in indices]
        for handle in handles:  # raises NVMLError_NotSupported before Volta
            pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    except Exception:  # noqa: BLE001 - any NVML failure means "not available"
        return None
    return lambda: [int(pynvml.nvmlDeviceGetTotalEnergyConsumption(h)) for h in handles]


# -------------------------------------------------------------------------------------- meter


class EnergyMeter:
    """Measures (or estimates) the energy of the work between :meth:`start` and :meth:`stop`.

    ``device``: ``"cpu"``, ``"cuda[:N]"`` (``count`` GPUs from N on) or a GPU table key (only
    estimated); ``method``: one of :data:`METHODS` (a named one that is unavailable refuses).
    The estimate uses ``threads`` x ``watts_per_core`` on a CPU (default: torch's threads) and
    each GPU's data-sheet TDP; ``rapl_root``: the powercap tree.
    """

    def __init__(self, device: str = "cpu", method: str = "auto", count: int = 1,
                 threads: int | None = None,
                 watts_per_core: float = DEFAULT_CPU_WATTS_PER_CORE,
                 rapl_root: str | os.PathLike = RAPL_ROOT):
        check_choice(method, METHODS, "method", "energy method")
        if count < 1:
            raise LmlabError(f"device count must be at least 1, got {count}", "pass count >= 1")
        self.device = device.lower()
        self.count = count
        self._is_cpu = self.device == "cpu"
        # counters (RAPL: uJ, wrapping at each zone's range; NVML: mJ, never wrapping)
        self._counters: Callable[[], list[int]] | None = None
        self._wraps: list[int] = []
        self._per_joule = 1e6
        self._power_watts = 0.0
        self.method = self._choose(method, threads, watts_per_core, rapl_root)
        self._last: list[int] = []
        self._joules = 0.0
        self._start_time: float | None = None
        self._running = False

    def _choose(self, method: str, threads: int | None, watts_per_core: float,
                rapl_root: str | os.PathLike) -> str:
        if self._is_cpu and method in ("auto", "rapl"):
            zones = rapl_zones(rapl_root)
            if zones:
                self._counters = lambda: [zone.read_uj() for zone in zones]
                self._wraps = [zone.max_range_uj for zone in zones]
                return "rapl (" + "+".join(z.name for z in zones) + ")"
            if method == "rapl":
                raise LmlabError(f"no readable RAPL counters under {rapl_root}",
                                 "run as a user who can read energy_uj, or use method='estimate'")
        if not self._is_cpu and method in ("auto", "nvml") and self.device.startswith("cuda"):
            first = int(self.device.split(":", 1)[1]) if ":" in self.device else 0
            self._counters = _nvml_counters(list(range(first, first + self.count)))
            if self._counters is not None:
                self._wraps, self._per_joule = [0] * self.count, 1e3
                return "nvml"
        if method == "nvml":
            raise LmlabError("NVML energy counters are not available here",
                             "install pynvml on a machine with a Volta or newer GPU, "
                             "or use method='estimate'")
        if method == "rapl":
            raise LmlabError("RAPL measures CPUs only", "use method='nvml' or 'estimate'")
        if self._is_cpu:
            if threads is None:
                import torch

                threads = torch.get_num_threads()
            self._power_watts = threads * watts_per_core
            return (f"estimate (TDP share: {threads} cores x {watts_per_core:g} W/core, "
                    "assumed fully loaded)")
        spec = gpu_spec(self.device)  # "cuda:N" is looked up by the name torch reports
        self._power_watts = self.count * spec.tdp_watts
        return f"estimate (board power: {self.count} x {spec.tdp_watts:g} W {spec.name} TDP)"

    def start(self) -> EnergyMeter:
        """Begin measuring (resets any previous reading)."""
        self._joules = 0.0
        self._last = self._counters() if self._counters is not None else []
        self._start_time = time.perf_counter()
        self._running = True
        return self

    def poll(self) -> float:
        """Fold the counters' progress since the last read into the total; joules so far.

        Cheap (a few small file reads); call it more often than the counters wrap.
        """
        if self._start_time is None:
            raise LmlabError("EnergyMeter.poll() before start()", "call meter.start() first")
        if not self._running:
            return self._joules
        if self._counters is None:
            self._joules = self._power_watts * (time.perf_counter() - self._start_time)
        else:
            now = self._counters()
            for before, after, wrap in zip(self._last, now, self._wraps):
                self._joules += counter_delta(before, after, wrap) / self._per_joule
            self._last = now
        return self._joules

    def stop(self) -> EnergyReading:
        """Stop measuring; the energy since :meth:`start` and the method used."""
        joules = self.poll()
        self._running = False
        return EnergyReading(joules, self.method)

    @property
    def reading(self) -> EnergyReading:
        """The energy so far (or the final one after :meth:`stop`)."""
        return EnergyReading(self.poll() if self._start_time is not None else 0.0, self.method)

    def __enter__(self) -> EnergyMeter:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
