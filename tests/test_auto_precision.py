"""precision "auto": bf16 only where this host measurably runs it faster (injected peaks)."""

from __future__ import annotations

import pytest

from lmlab.cost import precision as precision_module
from lmlab.cost.peak import CpuPeaks
from lmlab.cost.precision import auto_precision


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

    monkeypatch.setattr("lmlab.cost.precision.auto_precision",
                        lambda device, **shape: ("fp32", "injected for the test"))
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

    monkeypatch.setattr("lmlab.cost.precision.auto_precision",
                        lambda device, **shape: ("fp32", "injected for the test"))
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
        seen["finetune"] = kwargs["config"].precision
        raise Stop

    monkeypatch.setattr("lmlab.training.pretrain.pretrain", capture_pretrain)
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
    with pytest.raises(Stop):
        main(["finetune", "--config", str(config), "--task", "wordnet-wic", "--model",
              str(tmp_path), "--out", str(tmp_path / "f")])
    assert seen["finetune"] == "bf16"  # the config file's choice is kept


def test_finetune_resolves_auto_and_says_why(monkeypatch, tiny_bert_folder, tmp_path):
    from test_finetune import toy_task

    from lmlab.finetune.runner import finetune

    monkeypatch.setattr("lmlab.finetune.runner.auto_precision",
                        lambda device, **shape: ("fp32", "injected for the test"))
    result = finetune(toy_task(16, 8), tiny_bert_folder, tmp_path / "run", precision="auto",
                      epochs=1, batch_size=8, show_progress=False, save_model=False)
    assert result["precision"] == "fp32"
    assert result["precision_reason"] == "injected for the test"


# -- auto from the model's own linear shapes (lmlab.cost.shapes) -----------------------------------
def _two_layer_model():
    import torch

    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Linear(32, 8),
                               torch.nn.Linear(8, 32))


def test_linear_shapes_count_each_distinct_layer():
    from lmlab.cost.shapes import linear_shapes

    assert linear_shapes(_two_layer_model()) == {(8, 32): 2, (32, 8): 1}


@pytest.mark.parametrize("fp32_s,bf16_s,expected", [(4.0, 1.0, "bf16"), (1.0, 1.0, "fp32"),
                                                    (1.0, 2.0, "fp32")])
def test_auto_with_a_model_follows_its_own_shapes_not_the_square_peaks(
        monkeypatch, tmp_path, fp32_s, bf16_s, expected):
    """Square peaks say bf16 is 4x; the model's shapes decide, and are measured once per host."""
    monkeypatch.setenv("LMLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(precision_module, "cpu_has_native_bf16", lambda: True)
    monkeypatch.setattr("lmlab.cost.peak.cpu_peaks", lambda: _peaks(200e9, 800e9))
    calls = []

    def measure(shapes, tokens):
        calls.append((dict(shapes), tokens))
        return {"fp32": fp32_s, "bf16": bf16_s}

    monkeypatch.setattr("lmlab.cost.shapes.measure_linear_times", measure)
    model = _two_layer_model()
    chosen, reason = auto_precision("cpu", model=model, tokens=256)
    assert chosen == expected and "2 shapes at 256 tokens" in reason
    assert calls == [({(8, 32): 2, (32, 8): 1}, 256)]
    assert auto_precision("cpu", model=model, tokens=256)[0] == expected
    assert len(calls) == 1  # cached for this host and shape set
    auto_precision("cpu", model=model, tokens=512)
    assert len(calls) == 2  # another batch shape is another measurement


def test_linear_times_are_measured_on_both_paths():
    from collections import Counter

    from lmlab.cost.shapes import measure_linear_times

    seconds = measure_linear_times(Counter({(16, 32): 2}), tokens=64, reps=1)
    assert set(seconds) == {"fp32", "bf16"} and all(v > 0 for v in seconds.values())


def test_finetune_measures_the_architecture_it_will_train(monkeypatch, minilm_dir, tmp_path):
    """`finetune(precision="auto")` hands auto the model's layers (built without weights) and
    the recipe's tokens per batch."""
    from test_finetune import toy_task

    from lmlab.cost.shapes import linear_shapes
    from lmlab.finetune.runner import finetune

    seen = {}

    class Stop(Exception):
        pass

    def capture(device, model=None, tokens=None):
        seen.update(shapes=linear_shapes(model), tokens=tokens,
                    device=next(model.parameters()).device.type)
        raise Stop

    monkeypatch.setattr("lmlab.finetune.runner.auto_precision", capture)
    with pytest.raises(Stop):
        finetune(toy_task(16, 8), minilm_dir, tmp_path / "run", precision="auto",
                 batch_size=8, show_progress=False)
    assert seen["shapes"] == {(384, 384): 24, (384, 1536): 6, (1536, 384): 6}
    assert seen["device"] == "meta" and seen["tokens"] == 8 * 128
