"""Energy: RAPL parsing on a fake powercap tree (with wraparound) and the labelled estimate."""

from __future__ import annotations

import pytest

from lmlab.cost import energy as energy_module
from lmlab.cost.energy import EnergyMeter, counter_delta, rapl_zones
from lmlab.utils.errors import LmlabError

MAX = 262_143_328_850  # a real package counter's max_energy_range_uj


def _zone(path, name, energy, max_range=MAX):
    path.mkdir(parents=True, exist_ok=True)
    (path / "name").write_text(name + "\n")
    (path / "energy_uj").write_text(f"{energy}\n")
    (path / "max_energy_range_uj").write_text(f"{max_range}\n")
    return path


@pytest.fixture
def powercap(tmp_path):
    """package-0 with core and dram sub-zones, package-1, and a psys platform zone."""
    root = tmp_path / "powercap"
    pkg0 = _zone(root / "intel-rapl:0", "package-0", 1_000_000)
    _zone(pkg0 / "intel-rapl:0:0", "core", 500_000)
    _zone(pkg0 / "intel-rapl:0:1", "dram", 2_000_000, max_range=65_532_610_987)
    _zone(root / "intel-rapl:1", "package-1", MAX - 1_000_000)  # about to wrap
    _zone(root / "intel-rapl:2", "psys", 9_000_000)
    return root


def test_zone_discovery_counts_packages_and_dram_only(powercap):
    names = sorted(zone.name for zone in rapl_zones(powercap))
    assert names == ["dram", "package-0", "package-1"]
    assert rapl_zones(powercap / "missing") == []


def test_unreadable_counters_are_skipped(powercap):
    (powercap / "intel-rapl:1" / "energy_uj").write_text("garbage\n")
    assert "package-1" not in [zone.name for zone in rapl_zones(powercap)]


def test_counter_delta_handles_wraparound():
    assert counter_delta(100, 350, 1000) == 250
    assert counter_delta(900, 100, 1000) == 200  # 900 -> 1000 (wrap) -> 100
    assert counter_delta(5, 5, 1000) == 0


def test_rapl_meter_sums_zones_across_a_wrap(powercap):
    meter = EnergyMeter("cpu", rapl_root=powercap)
    assert meter.method.startswith("rapl") and not meter.reading.is_estimate
    meter.start()
    # +3 J on package-0; package-1 wraps: +1 J to the top and 2 J past zero; +0.5 J on dram
    (powercap / "intel-rapl:0" / "energy_uj").write_text("4000000\n")
    (powercap / "intel-rapl:1" / "energy_uj").write_text("2000000\n")
    (powercap / "intel-rapl:0" / "intel-rapl:0:1" / "energy_uj").write_text("2500000\n")
    assert meter.poll() == pytest.approx(3 + 3 + 0.5)
    # a second interval is added to the first
    (powercap / "intel-rapl:0" / "energy_uj").write_text("5000000\n")
    joules, method = meter.stop()
    assert joules == pytest.approx(7.5) and method.startswith("rapl")
    # after stop, changes are not counted
    (powercap / "intel-rapl:0" / "energy_uj").write_text("9000000\n")
    assert meter.reading.joules == pytest.approx(7.5)


def test_without_counters_the_cpu_falls_back_to_a_labelled_estimate(tmp_path, monkeypatch):
    clock = iter([100.0, 110.0])
    monkeypatch.setattr(energy_module.time, "perf_counter", lambda: next(clock))
    with EnergyMeter("cpu", rapl_root=tmp_path, threads=2, watts_per_core=5.0) as meter:
        pass
    joules, method = meter.reading
    assert joules == pytest.approx(2 * 5.0 * 10.0)
    assert method.startswith("estimate") and "W/core" in method
    assert meter.reading.is_estimate


def test_named_methods_that_are_unavailable_raise(tmp_path):
    with pytest.raises(LmlabError, match="RAPL"):
        EnergyMeter("cpu", method="rapl", rapl_root=tmp_path)
    with pytest.raises(LmlabError, match="NVML"):
        EnergyMeter("cpu", method="nvml", rapl_root=tmp_path)
    with pytest.raises(LmlabError, match="unknown energy method"):
        EnergyMeter("cpu", method="wattmeter")
    with pytest.raises(LmlabError, match="poll"):
        EnergyMeter("cpu", rapl_root=tmp_path, threads=1).poll()


def test_gpu_table_device_is_estimated_from_tdp(monkeypatch):
    clock = iter([0.0, 3600.0])
    monkeypatch.setattr(energy_module.time, "perf_counter", lambda: next(clock))
    meter = EnergyMeter("v100", count=2).start()
    joules, method = meter.stop()
    assert joules == pytest.approx(2 * 300 * 3600)  # 0.6 kWh
    assert method.startswith("estimate") and "TDP" in method
