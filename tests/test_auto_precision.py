"""precision "auto": bf16 only where this host measurably runs it faster (injected peaks)."""

from __future__ import annotations

import pytest

from lmlab.cost.peak import CpuPeaks
from lmlab.utils import precision as precision_module
from lmlab.utils.precision import auto_precision


def _peaks(fp32: float, bf16: float) -> CpuPeaks:
    return CpuPeaks(key="test-host", cpu_model="test", threads=2, torch_version="x",
                    peaks={"fp32": fp32, "bf16": bf16})


@pytest.mark.parametrize("fp32,bf16,expected", [
    (200e9, 800e9, "bf16"),   # Zen 5: bf16 four times fp32
    (275e9, 150e9, "fp32"),   # the Xeon without AMX: bf16 at half the fp32 rate
    (200e9, 230e9, "fp32"),   # faster, but under the 1.2x that pays for the rounding
])
def test_auto_follows_the_measured_rates(monkeypatch, fp32, bf16, expected):
    monkeypatch.setattr(precision_module, "cpu_has_native_bf16", lambda: True)
    monkeypatch.setattr("lmlab.cost.peak.cpu_peaks", lambda: _peaks(fp32, bf16))
    chosen, reason = auto_precision("cpu")
    assert chosen == expected and "GFLOP/s" in reason


def test_no_bf16_instructions_means_fp32_without_measuring(monkeypatch):
    monkeypatch.setattr(precision_module, "cpu_has_native_bf16", lambda: False)

    def must_not_measure():
        raise AssertionError("measured although the CPU has no bf16 instructions")

    monkeypatch.setattr("lmlab.cost.peak.cpu_peaks", must_not_measure)
    assert auto_precision("cpu")[0] == "fp32"


def test_demo_resolves_auto_before_its_stages(monkeypatch, tmp_path):
    from lmlab.demo import job

    monkeypatch.setattr("lmlab.utils.precision.auto_precision",
                        lambda device: ("fp32", "injected for the test"))
    seen = {}

    def stop(config, stages):
        seen["precision"] = config.precision
        raise RuntimeError("stop after the first stage")

    monkeypatch.setattr(job, "_corpus_stage", stop)
    with pytest.raises(RuntimeError, match="stop after"):
        job.run_demo(job.DemoConfig(out=str(tmp_path / "demo"), budget=60))
    assert seen["precision"] == "fp32"


def test_trainer_resolves_auto(monkeypatch, tmp_path):
    import torch

    from lmlab.training import TrainingConfig
    from lmlab.training.trainer import Trainer

    monkeypatch.setattr("lmlab.utils.precision.auto_precision",
                        lambda device: ("fp32", "injected for the test"))
    model = torch.nn.Linear(2, 2)
    cfg = TrainingConfig(precision="auto", max_steps=1, device="cpu", progress=False)
    trainer = Trainer(model, torch.nn.Module(), [], cfg, tmp_path / "run", track_cost=False)
    assert trainer.cfg.precision == "fp32"
    assert trainer.precision_reason == "injected for the test"


def test_cli_commands_default_to_auto(monkeypatch, tmp_path):
    """`lmlab pretrain` (unless its --config file sets a precision) and `lmlab finetune` take
    auto; the library's TrainingConfig keeps fp32."""
    from lmlab.cli import main
    from lmlab.training import TrainingConfig

    assert TrainingConfig(max_steps=1).precision == "fp32"
    seen = {}

    class Stop(Exception):
        pass

    def capture_pretrain(config):
        seen["pretrain"] = config.training.precision
        raise Stop

    def capture_finetune(task, model, out, **kwargs):
        seen["finetune"] = kwargs["precision"]
        raise Stop

    monkeypatch.setattr("lmlab.pretrain", capture_pretrain)
    monkeypatch.setattr("lmlab.finetune.runner.finetune", capture_finetune)
    with pytest.raises(Stop):
        main(["pretrain", "--shards", str(tmp_path), "--out", str(tmp_path / "o"),
              "--steps", "1"])
    config = tmp_path / "run.json"
    config.write_text('{"speed": {"precision": "bf16"}}')
    with pytest.raises(Stop):
        main(["pretrain", "--config", str(config), "--shards", str(tmp_path), "--out",
              str(tmp_path / "o"), "--steps", "1"])
    assert seen["pretrain"] == "bf16"  # the config file's choice is kept
    with pytest.raises(Stop):
        main(["pretrain", "--shards", str(tmp_path), "--out", str(tmp_path / "o"),
              "--steps", "1"])
    assert seen["pretrain"] == "auto"
    with pytest.raises(Stop):
        main(["finetune", "--task", "wordnet-wic", "--model", str(tmp_path), "--out",
              str(tmp_path / "f")])
    assert seen["finetune"] == "auto"


def test_finetune_resolves_auto_and_says_why(monkeypatch, tiny_bert_folder, tmp_path):
    from test_finetune import toy_task

    from lmlab.finetune.runner import finetune

    monkeypatch.setattr("lmlab.finetune.runner.auto_precision",
                        lambda device: ("fp32", "injected for the test"))
    result = finetune(toy_task(16, 8), tiny_bert_folder, tmp_path / "run", precision="auto",
                      epochs=1, batch_size=8, show_progress=False, save_model=False)
    assert result["precision"] == "fp32"
    assert result["precision_reason"] == "injected for the test"
