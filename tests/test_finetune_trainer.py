"""Fine-tuning (BERT and ULMFiT recipes) on the one Trainer: exact resume after SIGKILL through
``lmlab finetune``, ``--budget``, ``--device``, bf16 with checkpoints and a cost report, the
run folder's resume / refuse / ``--overwrite`` rules, and the dev-selection hook."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import FakeClock
from safetensors.torch import load_file
from test_finetune import toy_task

from lmlab.finetune.runner import finetune
from lmlab.training.metrics_log import read_metrics
from lmlab.utils.errors import LmlabError


def _write_task_files(folder: Path, n_train: int = 32, n_dev: int = 12) -> list[str]:
    """The toy task as jsonl files; returns the task options of ``lmlab finetune``."""
    task = toy_task(n_train, n_dev)
    for split in ("train", "dev", "test"):
        (folder / f"{split}.jsonl").write_text("\n".join(
            json.dumps({"text": e.text, "label": e.label}) for e in task.splits[split]))
    return ["--task", "toy", "--train", str(folder / "train.jsonl"), "--dev",
            str(folder / "dev.jsonl"), "--test", str(folder / "test.jsonl")]


def _launch(args: list[str]) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", LMLAB_NO_PROGRESS="1")
    return subprocess.Popen([sys.executable, "-m", "lmlab", "finetune", "--precision", "fp32",
                             *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _outcome(run: Path) -> dict:
    metrics = json.loads((run / "metrics.json").read_text())
    history = json.loads((run / "finetune.json").read_text())["history"]
    return {"dev": metrics["dev"], "test": metrics["test"], "best": metrics["best_epoch"],
            "stop": metrics["stop_reason"], "history": history}


# ULMFiT's resume (its unfreezing and per-layer rates) is slow-marked: the default suite kills and
# resumes the BERT recipe here and a distributed run in test_distributed_cli.py
@pytest.mark.parametrize("recipe", ["bert", pytest.param("ulmfit", marks=pytest.mark.slow)])
def test_sigkill_and_rerun_equals_an_uninterrupted_run(tiny_bert_folder, tmp_path, recipe):
    """Checkpoints every epoch; kill -9 after the first; the same command again resumes and
    ends with the weights, dev/test metrics and epoch history of an uninterrupted run."""
    options = _write_task_files(tmp_path) + [
        "--model", str(tiny_bert_folder), "--recipe", recipe, "--epochs", "12",
        "--patience", "12", "--batch-size", "8", "--lr", "1e-3"]
    reference = _launch([*options, "--out", str(tmp_path / "reference")])
    killed = tmp_path / "killed"
    victim = _launch([*options, "--out", str(killed)])
    deadline = time.time() + 300
    while not (killed / "checkpoints" / "step-4").is_dir():  # epoch 1 = 4 steps of 8
        assert victim.poll() is None, victim.communicate()[0]
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.005)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL
    assert not (killed / "finetune.json").exists()  # killed before the end
    out, _ = reference.communicate(timeout=300)
    assert reference.returncode == 0, out
    resumed = _launch([*options, "--out", str(killed)])
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out
    assert "resuming from" in out
    assert _outcome(killed) == _outcome(tmp_path / "reference")
    ours = load_file(killed / "model" / "model.safetensors")
    theirs = load_file(tmp_path / "reference" / "model" / "model.safetensors")
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)  # exact: a resumed run repeats the run's ops
    steps = [r["step"] for r in read_metrics(killed / "metrics.jsonl") if r["kind"] == "train"]
    assert steps == sorted(set(steps))  # the killed session's log was cut at the checkpoint


def test_budget_stops_on_the_trainer_clock(tiny_bert_folder, tmp_path, monkeypatch):
    """A fake clock that moves 1 s per training batch: a 3 s budget ends the run after step 3,
    mid-epoch; that partial epoch is scored on dev like a full one."""
    import lmlab.finetune.data as fdata

    clock = FakeClock()
    batches = fdata.TaskStream.__iter__

    def clocked(self):
        for batch in batches(self):
            clock.now += 1.0
            yield batch

    monkeypatch.setattr("lmlab.training.trainer.time", clock)
    monkeypatch.setattr(fdata.TaskStream, "__iter__", clocked)
    result = finetune(toy_task(32, 8), tiny_bert_folder, tmp_path / "run", epochs=5,
                      batch_size=8, budget_seconds=3.0, show_progress=False)
    assert result["stop_reason"] == "budget" and result["steps"] == 3
    assert [h["step"] for h in result["history"]] == [3] and result["best_epoch"] == 1
    assert "accuracy" in result["dev"]


def test_device_flows_through_and_cuda_without_gpu_is_refused(tiny_bert_folder, tmp_path,
                                                             monkeypatch):
    from lmlab.cli import main

    result = finetune(toy_task(16, 4), tiny_bert_folder, tmp_path / "cpu", epochs=1,
                      batch_size=8, device="cpu", show_progress=False)
    config = json.loads((tmp_path / "cpu" / "config.json").read_text())
    assert result["device"] == "cpu" and config["speed"]["device"] == "cpu"
    assert config["device"] == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(LmlabError, match="CUDA is not available"):
        finetune(toy_task(16, 4), tiny_bert_folder, tmp_path / "gpu", device="cuda")
    assert not (tmp_path / "gpu").exists()  # refused before any work
    with pytest.raises(LmlabError, match="unknown device 'tpu'"):
        finetune(toy_task(16, 4), tiny_bert_folder, tmp_path / "gpu", device="tpu")
    options = _write_task_files(tmp_path, 16, 4)
    assert main(["finetune", *options, "--model", str(tiny_bert_folder), "--out",
                 str(tmp_path / "cli"), "--device", "cuda"]) != 0
    assert not (tmp_path / "cli").exists()


def test_bf16_run_has_checkpoint_and_cost_report(tiny_bert_folder, tmp_path, monkeypatch):
    """bf16 autocast trains and evaluates (emulated on this CPU); the run folder holds a
    checkpoint with the best weights, the cost report and the run report."""
    from lmlab.cost import precision

    monkeypatch.setattr(precision, "_warned", True)  # the slow-bf16 warning is tested elsewhere
    run = tmp_path / "bf16"
    result = finetune(toy_task(16, 4), tiny_bert_folder, run, epochs=2, batch_size=8,
                      precision="bf16", show_progress=False)
    assert result["precision"] == "bf16" and "accuracy" in result["dev"]
    assert all(torch.isfinite(torch.tensor(h["train_loss"])) for h in result["history"])
    (checkpoint,) = (run / "checkpoints").iterdir()
    assert checkpoint.name == "step-4" and (checkpoint / "dev-best.safetensors").is_file()
    for name in ("cost.md", "cost.json", "report.md", "config.json", "metrics.jsonl",
                 "model/config.json", "model/tokenizer.json", "finetune.json"):
        assert (run / name).is_file(), name
    config = json.loads((run / "config.json").read_text())
    assert config["speed"]["precision"] == "bf16" and config["hparams"]["recipe"]["name"] == "bert"
    evals = [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [2, 4]  # each epoch's dev scores, in the report too
    assert evals[-1]["eval_dev_accuracy"] == result["history"][-1]["dev_accuracy"]
    assert "eval_dev_accuracy" in (run / "report.md").read_text()


def test_rerun_resumes_refuses_other_settings_or_starts_over(tiny_bert_folder, tmp_path):
    task = toy_task(16, 4)
    first = finetune(task, tiny_bert_folder, tmp_path / "run", epochs=2, batch_size=8,
                     show_progress=False)
    again = finetune(task, tiny_bert_folder, tmp_path / "run", epochs=2, batch_size=8,
                     show_progress=False)  # a finished run: nothing to train, same result
    assert again["dev"] == first["dev"] and again["history"] == first["history"]
    with pytest.raises(LmlabError, match="other settings .*lr"):
        finetune(task, tiny_bert_folder, tmp_path / "run", epochs=2, batch_size=8, lr=1e-3,
                 show_progress=False)
    over = finetune(task, tiny_bert_folder, tmp_path / "run", epochs=1, batch_size=8, lr=1e-3,
                    show_progress=False, overwrite=True)
    assert [h["epoch"] for h in over["history"]] == [1]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(LmlabError, match="already holds notes.txt"):
        finetune(task, tiny_bert_folder, tmp_path / "other", epochs=1, show_progress=False)


def test_early_stopping_is_remembered_by_a_rerun(tiny_bert_folder, tmp_path):
    """lr 0: the dev score never improves, so patience 1 stops after epoch 2; rerunning the
    finished run must not train on."""
    task = toy_task(16, 4)
    kwargs = dict(epochs=5, batch_size=8, lr=1e-12, patience=1, show_progress=False)
    first = finetune(task, tiny_bert_folder, tmp_path / "run", **kwargs)
    assert first["stop_reason"] == "early_stopping" and first["steps"] == 4
    assert first["best_epoch"] == 1
    again = finetune(task, tiny_bert_folder, tmp_path / "run", **kwargs)
    assert again["steps"] == 4 and again["history"] == first["history"]


def test_ulmfit_unfreezes_one_group_per_epoch(tiny_bert_folder, tmp_path, monkeypatch):
    """Epoch k trains the top k+1 layer groups: embeddings stay put until epoch 4 (a 2-layer
    model has 4 groups), the head moves from the first step; all train again afterwards."""
    from lmlab.finetune import hooks

    seen = []
    original = hooks.Unfreezing.on_step_start

    def spy(self, trainer):
        original(self, trainer)
        embeddings = self.model.transformer.embeddings.word_embeddings.weight
        seen.append((trainer.step, embeddings.requires_grad))

    monkeypatch.setattr(hooks.Unfreezing, "on_step_start", spy)
    result = finetune(toy_task(16, 4), tiny_bert_folder, tmp_path / "ulm", recipe="ulmfit",
                      epochs=4, batch_size=8, patience=4, show_progress=False,
                      save_model=False)
    assert [h["epoch"] for h in result["history"]] == [1, 2, 3, 4]
    assert [trainable for _, trainable in seen] == [False] * 6 + [True] * 2
    # fewer epochs than groups: the last epoch still trains every group (the paper's last
    # stage), not only the top ones
    seen.clear()
    finetune(toy_task(16, 4), tiny_bert_folder, tmp_path / "ulm2", recipe="ulmfit", epochs=2,
             batch_size=8, patience=2, show_progress=False, save_model=False)
    assert [trainable for _, trainable in seen] == [False] * 2 + [True] * 2
    assert not (tmp_path / "ulm" / "model").exists()
