"""CO2 and money arithmetic, CostReport rendering, CostTracker bookkeeping, run estimates."""

from __future__ import annotations

import pytest

from lmlab.cost import report as report_module
from lmlab.cost.estimate import estimate_run, implied_mfu
from lmlab.cost.flops import flops_per_token
from lmlab.cost.presets import preset_config
from lmlab.cost.report import (
    DEFAULT_GRID_G_PER_KWH,
    LB_PER_KG,
    CostTracker,
    co2_kg,
    money,
)
from lmlab.utils.errors import LmlabError

STRUBELL_US_LB_PER_KWH = 0.954  # the US grid average Strubell et al. (2019) used (EPA 2018)


def test_co2_arithmetic():
    one_kwh = 3.6e6
    assert co2_kg(one_kwh) == pytest.approx(DEFAULT_GRID_G_PER_KWH / 1000)
    assert co2_kg(one_kwh, grid_g_per_kwh=100, pue=1.5) == pytest.approx(0.15)
    # Strubell et al.: 1507 kWh (PUE included) at 0.954 lb/kWh -> 1438 lb for BERT-base
    g_per_kwh = STRUBELL_US_LB_PER_KWH / LB_PER_KG * 1000
    assert co2_kg(1507 * one_kwh, g_per_kwh) * LB_PER_KG == pytest.approx(1438, abs=1)  # tol: the paper's whole pounds
    with pytest.raises(LmlabError):
        co2_kg(one_kwh, pue=0.5)


def test_money_arithmetic():
    assert money(79 * 3600, 64, 2.0) == pytest.approx(79 * 64 * 2.0)
    assert money(1800, 1, 0.5) == pytest.approx(0.25)
    with pytest.raises(LmlabError):
        money(1, 1, -1.0)


@pytest.fixture
def clock(monkeypatch):
    """A fake clock for the tracker and the meter: each call advances a settable time."""
    state = {"now": 1000.0}
    monkeypatch.setattr(report_module.time, "perf_counter", lambda: state["now"])
    from lmlab.cost import energy

    monkeypatch.setattr(energy.time, "perf_counter", lambda: state["now"])
    return state


def test_tracker_counts_tokens_flops_mfu_energy_and_money(clock):
    config = preset_config("bert-mini")
    tracker = CostTracker(config, seq_len=128, precision="fp32", device="cpu",
                          peak_flops_per_s=100e9, energy_method="estimate",
                          price_per_hour=3.6, grid_g_per_kwh=500, model_name="bert-mini")
    tracker.start()
    for _ in range(4):
        clock["now"] += 2.5
        tracker.add_tokens(32 * 128)
    tracker.add_tokens(16 * 64, seq_len=64)
    tracker.stop()
    clock["now"] += 100  # time after stop() must not count
    rep = tracker.report()

    fpt128, fpt64 = flops_per_token(config, 128), flops_per_token(config, 64)
    assert rep.tokens == 4 * 32 * 128 + 16 * 64
    assert rep.flops == pytest.approx(4 * 32 * 128 * fpt128 + 16 * 64 * fpt64)
    assert rep.wall_seconds == pytest.approx(10.0)
    assert rep.achieved_flops_per_s == pytest.approx(rep.flops / 10.0)
    assert rep.mfu == pytest.approx(rep.achieved_flops_per_s / 100e9)
    assert rep.energy_method.startswith("estimate")
    import torch

    assert rep.energy_joules == pytest.approx(torch.get_num_threads() * 5.0 * 10.0)
    assert rep.co2_kg == pytest.approx(rep.energy_joules / 3.6e6 * 0.5)
    assert rep.money == pytest.approx(10.0 / 3600 * 3.6)
    assert rep.parameters == config.num_parameters()
    assert "ESTIMATE" in " ".join(rep.notes)


def test_report_markdown_and_dict_contain_every_field(clock):
    tracker = CostTracker(preset_config("bert-tiny"), seq_len=64, device="cpu",
                          peak_flops_per_s=50e9, energy_method="estimate", price_per_hour=1.0)
    tracker.start()
    clock["now"] += 4.0
    tracker.add_tokens(1000)
    rep = tracker.report()
    text = rep.to_markdown()
    for label in ("model", "parameters", "tokens seen", "FLOPs per token", "FLOPs (model, total)",
                  "wall time", "device", "achieved", "peak (MFU denominator)", "MFU", "energy",
                  "CO2", "money", "given by the caller", "estimate"):
        assert label in text, label
    assert f"{rep.tokens:,}" in text and f"{100 * rep.mfu:.1f}%" in text
    values = rep.to_dict()
    for key in ("parameters", "tokens", "flops", "achieved_flops_per_s", "mfu", "peak_label",
                "wall_seconds", "energy_joules", "energy_method", "energy_kwh", "co2_kg", "money"):
        assert key in values, key
    line = rep.summary_line()
    assert "MFU" in line and "tokens" in line and "est." in line


def test_tracker_without_a_peak_omits_mfu(monkeypatch, tmp_path, clock):
    monkeypatch.setenv("LMLAB_CACHE", str(tmp_path))
    tracker = CostTracker(preset_config("bert-tiny"), seq_len=64, device="cpu",
                          measure_peak=False, energy_method="estimate").start()
    tracker.add_tokens(10)
    rep = tracker.report()
    assert rep.mfu is None and rep.money is None
    assert "n/a" in rep.to_markdown() and "not priced" in rep.to_markdown()
    with pytest.raises(LmlabError):
        CostTracker(preset_config("bert-tiny"), seq_len=64).add_tokens(1)


def test_estimate_is_consistent_and_states_assumptions():
    est = estimate_run("bert-base", 42e9, device="v100", devices=64, precision="fp16", mfu=0.3,
                       seq_len="128:0.9,512:0.1", price_per_hour=2.0, pue=1.58)
    assert est.seconds == pytest.approx(est.total_flops / (64 * 125e12 * 0.3))
    assert est.energy_joules == pytest.approx(64 * 300 * est.seconds)
    assert est.co2_kg == pytest.approx(co2_kg(est.energy_joules, DEFAULT_GRID_G_PER_KWH, 1.58))
    assert est.money == pytest.approx(est.hours * 64 * 2.0)
    joined = " ".join(est.assumptions)
    for needle in ("precision fp16", "MFU 0.3", "FLOPs per token", "PUE 1.58", "estimate"):
        assert needle in joined
    assert implied_mfu(est.total_flops, est.hours, 64, 125e12) == pytest.approx(0.3)
    assert estimate_run("gpt2-small", 1e9, device="a100").precision == "bf16"
    assert estimate_run("gpt2-small", 1e9, device="v100").precision == "fp16"
    with pytest.raises(LmlabError):
        estimate_run("bert-base", 1e9, mfu=1.5)
    for bad, option in (({"tokens": -5}, "--tokens"), ({"devices": 0}, "--count"),
                        ({"power_watts": -3.0}, "--power-watts")):
        with pytest.raises(LmlabError, match=option):
            estimate_run(**{"model": "bert-base", "tokens": 1e9, **bad})
