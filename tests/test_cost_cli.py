"""`lmlab cost estimate / flops / peak` through the real CLI entry point."""

from __future__ import annotations

import json

from lmlab.cli import main
from lmlab.cost import peak as peak_module


def test_estimate_prints_the_answer_and_its_assumptions(capsys):
    code = main(["cost", "estimate", "--model", "bert-base", "--tokens", "42e9", "--device",
                 "v100", "--count", "64", "--precision", "fp16", "--mfu", "0.3", "--seq-len",
                 "128:0.9,512:0.1", "--price-per-hour", "2.48"])
    out = capsys.readouterr().out
    assert code == 0
    for needle in ("assumptions:", "precision fp16", "MFU 0.3", "FLOPs per token",
                   "125 TFLOP/s", "128 for 90% of steps", "ESTIMATE", "kg CO2e", "$"):
        assert needle in out, needle


def test_estimate_json_and_token_suffixes(capsys):
    assert main(["cost", "estimate", "--model", "gpt2-small", "--tokens", "9B", "--device",
                 "h100", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["tokens"] == 9e9 and data["precision"] == "bf16"
    assert data["assumptions"] and data["money"] is None


def test_unknown_model_is_a_user_error(capsys):
    assert main(["cost", "estimate", "--model", "bert-huge", "--tokens", "1e9"]) == 2
    err = capsys.readouterr().err
    assert "unknown model size" in err and "bert-base" in err


def test_flops_breakdown_command(capsys):
    assert main(["cost", "flops", "--model", "bert-base", "--seq-len", "128"]) == 0
    out = capsys.readouterr().out
    assert "output projection" in out and "attention scores" in out and "21.1%" in out


def test_peak_command_prints_cpu_and_gpu_peaks(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("LMLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(peak_module, "measure_cpu_peaks",
                        lambda sizes=(), reps=3: {"fp32": 150e9, "bf16": 600e9})
    monkeypatch.setattr(peak_module, "_load_average", lambda: 99.0)
    assert main(["cost", "peak"]) == 0
    out = capsys.readouterr().out
    assert "150 GFLOP/s" in out and "600 GFLOP/s" in out
    assert "h100" in out and "989.4" in out and "V100" in out
    assert "measured under load" in out
    assert (tmp_path / "cost" / "peaks.json").exists()
