"""Peak FLOP/s: the real (tiny) measurement, the per-machine cache, the GPU table."""

from __future__ import annotations

import json

import pytest

from lmlab.cost import peak as peak_module
from lmlab.cost.peak import (
    GPU_SPECS,
    CpuPeaks,
    cpu_peaks,
    device_peak,
    gpu_key_from_name,
    gpu_spec,
    measure_cpu_peaks,
)
from lmlab.utils.errors import LmlabError
from lmlab.utils.host import describe_host


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LMLAB_CACHE", str(tmp_path))
    return tmp_path / "cost" / "peaks.json"


@pytest.fixture
def fake_measure(monkeypatch):
    calls = []

    def measure(sizes=(2048, 3072), reps=3):
        calls.append((tuple(sizes), reps))
        return {"fp32": 100e9 * len(calls), "fp32-onednn": 250e9, "bf16": 400e9}

    monkeypatch.setattr(peak_module, "measure_cpu_peaks", measure)
    monkeypatch.setattr(peak_module, "_load_average", lambda: 0.0)  # a quiet machine
    return calls


def test_real_measurement_on_small_matrices():
    peaks = measure_cpu_peaks(sizes=(96,), reps=1)
    assert {"fp32", "bf16"} <= set(peaks)
    assert all(value > 0 for value in peaks.values())


def test_peaks_are_measured_once_then_read_from_the_cache(cache, fake_measure):
    assert cpu_peaks(measure=False) is None and not fake_measure
    first = cpu_peaks()
    assert len(fake_measure) == 1 and cache.exists()
    stored = json.loads(cache.read_text())
    assert stored["machines"][describe_host()]["peaks"]["fp32"] == first.peaks["fp32"]
    second = cpu_peaks()
    assert len(fake_measure) == 1, "a cached machine must not be measured again"
    assert second.peaks == first.peaks and second.key == first.key
    refreshed = cpu_peaks(refresh=True)
    assert len(fake_measure) == 2 and refreshed.peaks["fp32"] != first.peaks["fp32"]
    assert not list(cache.parent.glob(".*.tmp")), "atomic write left a temporary file"


def test_other_machines_in_the_cache_are_kept(cache, fake_measure):
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"version": 1, "machines": {"other box": {
        "cpu_model": "x", "threads": 8, "torch_version": "2.0", "peaks": {"fp32": 1.0}}}}))
    cpu_peaks()
    machines = json.loads(cache.read_text())["machines"]
    assert "other box" in machines and describe_host() in machines


def test_corrupt_cache_is_remeasured(cache, fake_measure):
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text("{not json")
    assert cpu_peaks().peaks["bf16"] == 400e9
    assert len(fake_measure) == 1


def test_cpu_denominator_is_named_and_path_selectable(cache, fake_measure):
    value, label = device_peak("cpu", "fp32")
    assert value == 100e9 and "torch.matmul fp32" in label
    best, best_label = cpu_peaks().peak("fp32", path="best")
    assert best == 250e9 and "oneDNN" in best_label
    assert device_peak("cpu", "bf16")[0] == 400e9


def test_missing_cpu_path_raises():
    peaks = CpuPeaks(key="k", cpu_model="m", threads=1, torch_version="t", peaks={"fp32": 1e9})
    with pytest.raises(LmlabError, match="no measured CPU peak"):
        peaks.peak("bf16")


def test_gpu_table_peaks_and_errors():
    assert device_peak("v100", "fp16")[0] == 125e12
    assert device_peak("a100", "bf16")[0] == 312e12
    h100, label = device_peak("h100", "bf16")
    assert h100 == pytest.approx(989.4e12) and "dense" in label
    assert GPU_SPECS["h200"].peaks == GPU_SPECS["h100"].peaks
    with pytest.raises(LmlabError, match="no bf16 figure"):
        device_peak("v100", "bf16")
    with pytest.raises(LmlabError, match="no peak figures"):
        device_peak("tpu-v3", "bf16")
    with pytest.raises(LmlabError, match="unknown precision"):
        device_peak("v100", "fp8")


@pytest.mark.parametrize("name,key", [
    ("Tesla V100-SXM2-16GB", "v100"), ("Tesla V100-PCIE-32GB", "v100-pcie"),
    ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H100 PCIe", "h100-pcie"), ("NVIDIA H200", "h200"), ("Tesla T4", "t4"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"), ("NVIDIA GeForce RTX 3090", "rtx3090"),
    ("Tesla P100-PCIE-16GB", "p100"), ("Some Other GPU", None),
])
def test_cuda_names_map_to_table_keys(name, key):
    assert gpu_key_from_name(name) == key


def test_cuda_devices_are_looked_up_by_the_name_torch_reports(monkeypatch):
    import torch

    names = {0: "Tesla T4", 1: "Tesla V100-SXM2-16GB"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: names[index])
    assert gpu_spec("cuda").name == "NVIDIA T4"
    assert device_peak("cuda:1", "fp16")[0] == 125e12
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(LmlabError, match="no CUDA GPU"):
        device_peak("cuda", "fp16")


def test_load_during_measurement_is_recorded_and_flagged(cache, fake_measure, monkeypatch):
    monkeypatch.setattr(peak_module, "_load_average", lambda: 64.0)
    peaks = cpu_peaks()
    assert peaks.load_average == 64.0 and peaks.measured_under_load
    assert json.loads(cache.read_text())["machines"][describe_host()]["load_average"] == 64.0
    idle = CpuPeaks(key="k", cpu_model="m", threads=2, torch_version="t", peaks={},
                    load_average=0.3)
    assert not idle.measured_under_load


def test_peak_measured_under_load_is_measured_again_when_quiet(cache, fake_measure, monkeypatch):
    monkeypatch.setattr(peak_module, "_load_average", lambda: 64.0)
    loaded = cpu_peaks()
    assert loaded.measured_under_load and len(fake_measure) == 1
    assert cpu_peaks().peaks == loaded.peaks and len(fake_measure) == 1, "still loaded: reuse"
    monkeypatch.setattr(peak_module, "_load_average", lambda: 0.1)
    quiet = cpu_peaks()
    assert len(fake_measure) == 2 and not quiet.measured_under_load
    assert quiet.peaks["fp32"] == 200e9  # the better of the two measurements is kept
    assert cpu_peaks().peaks == quiet.peaks and len(fake_measure) == 2


def test_tracker_mfu_is_against_the_fastest_path_of_its_precision(cache, fake_measure):
    """An fp32 run's MFU denominator is the faster of MKL (100) and oneDNN (250), not the path
    torch takes by default; bf16 has one path."""
    from lmlab.cost.presets import preset_config
    from lmlab.cost.report import CostTracker

    fp32 = CostTracker(preset_config("bert-tiny"), seq_len=64, device="cpu", precision="fp32",
                       energy_method="estimate")
    assert fp32._peak()[0] == 250e9 and "oneDNN" in fp32._peak()[1]
    bf16 = CostTracker(preset_config("bert-tiny"), seq_len=64, device="cpu", precision="bf16",
                       energy_method="estimate")
    assert bf16._peak()[0] == 400e9


def test_docs_gpu_table_and_defaults_match_the_data_file():
    """docs/cost.md repeats lmlab/cost/facts.json (the one source): the two must agree."""
    from pathlib import Path

    from lmlab.cost.facts import facts

    doc = (Path(__file__).parents[1] / "docs" / "cost.md").read_text(encoding="utf-8")
    rows = {}
    for line in doc.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 8 and cells[0] in GPU_SPECS:
            rows[cells[0]] = cells
    assert list(rows) == list(GPU_SPECS)  # every GPU, in the file's order
    for key, (_, name, *peaks, tdp, _source) in rows.items():
        spec = GPU_SPECS[key]
        assert spec.name.endswith(name) and float(tdp) == spec.tdp_watts
        for precision, cell in zip(("fp32", "tf32", "fp16", "bf16"), peaks):
            # exact: the doc's TFLOP/s and the file's FLOP/s are the same decimal figure
            assert (float(cell + "e12") if cell != "-" else None) == spec.peaks.get(precision)
    assert f"**{facts()['grid_g_per_kwh']['value']:g} g CO2e/kWh**" in doc
    assert f"threads x {facts()['cpu_watts_per_core']['value']:g} W" in doc
