"""The feature-based recipe on the Trainer: frozen-encoder features as the stream, a scalar-mix
head as the model; deterministic, exactly resumable, early-stopping, loadable in a new process."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
from conftest import assert_close_rounding
from safetensors.torch import load_file
from test_finetune import toy_task as finetune_toy_task

from lmlab.finetune.data import encode_examples
from lmlab.finetune.feature_based import (
    FEATURE_HEAD_WEIGHTS,
    FeatureHead,
    FeatureObjective,
    FeatureStream,
    train_feature_based,
)
from lmlab.finetune.recipes import get_recipe
from lmlab.finetune.runner import load_model
from lmlab.finetune.train import RunOptions
from lmlab.models.pooling import ScalarMix
from lmlab.tasks.types import Task
from lmlab.tokenization.tokenizer import Tokenizer
from lmlab.training.trainer import Trainer
from lmlab.utils.errors import LmlabError


def toy_task(n_train: int = 40, n_dev: int = 16, task_type: str = "classification") -> Task:
    """test_finetune's toy task ('the X is here' -> the class of X), smaller: a frozen random
    encoder + scalar mix can separate it."""
    return finetune_toy_task(n_train, n_dev, task_type)


def train(folder, out, seed: int = 0, random_init: bool = False, save_every: int | None = None,
          **overrides):
    """One feature-based run of the toy task on the tiny encoder in ``folder``."""
    model, tokenizer, _ = load_model(folder, random_init, seed=5)
    recipe = get_recipe("feature", **{"epochs": 4, "lr": 5e-2, "batch_size": 16, "patience": 10,
                                      **overrides})
    return train_feature_based(toy_task(), model, tokenizer, recipe, seed, out,
                               RunOptions(save_every=save_every, progress=False))


def head_weights(result, folder) -> dict[str, torch.Tensor]:
    """The trained head, as the run's saver writes it."""
    result.save(folder)
    return load_file(str(folder / FEATURE_HEAD_WEIGHTS))


def assert_same_run(a: dict, b: dict, a_dir, b_dir) -> None:
    assert a["history"] == b["history"]
    assert (a["best_epoch"], a["stop_reason"], a["steps"]) == \
        (b["best_epoch"], b["stop_reason"], b["steps"])
    for split in ("dev", "test"):
        assert a.predict(split) == b.predict(split)
    weights_a, weights_b = head_weights(a, a_dir / "model"), head_weights(b, b_dir / "model")
    assert weights_a.keys() == weights_b.keys()
    for name in weights_a:
        assert torch.equal(weights_a[name], weights_b[name]), name  # exact: the same run twice


@pytest.mark.numerics
def test_scalar_mix_is_softmax_weighted():
    mix = ScalarMix(3)
    with torch.no_grad():
        mix.weights.copy_(torch.tensor([0.0, 0.0, 100.0]))
        mix.gamma.fill_(2.0)
    layers = torch.randn(4, 3, 5)
    # softmax([0, 0, 100]) weighs the first two layers e^-100: a sum of 3 terms of size 2|x|
    assert_close_rounding(mix(layers), 2 * layers[:, 2], terms=3,
                          scale=2 * float(layers.abs().max()))


def test_feature_stream_resumes_at_its_position():
    features, labels = torch.randn(10, 3, 4), torch.arange(10)
    stream = FeatureStream(features, labels, batch_size=4, seed=1)
    assert len(stream) == 3
    batches = iter(stream)
    first_epoch = [next(batches)["labels"] for _ in range(3)]
    assert sorted(torch.cat(first_epoch).tolist()) == list(range(10))  # every example, once
    next(batches)
    resumed = FeatureStream(features, labels, batch_size=4, seed=1)
    resumed.load_state_dict(stream.state_dict())
    expected, got = next(batches), next(iter(resumed))
    assert torch.equal(got["labels"], expected["labels"])
    assert torch.equal(got["features"], features[expected["labels"]])  # exact: an index
    with pytest.raises(LmlabError, match="no training examples"):
        FeatureStream(features[:0], labels[:0], batch_size=4)


@pytest.mark.numerics
def test_objective_is_the_heads_loss_in_fp32():
    head = FeatureHead(3, 4, 2, layer=None).eval()
    batch = {"features": torch.randn(5, 3, 4), "labels": torch.tensor([0, 1, 1, 0, 1])}
    objective = FeatureObjective(regression=False)
    objective.prepare(head)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # a bf16 run: the head stays fp32
        result = objective.compute_loss(head, batch)
    expected = torch.nn.functional.cross_entropy(head(batch["features"]), batch["labels"])
    assert result.loss.dtype == torch.float32 and result.num_predictions == 5
    # fp32 (a bf16 head would be off by about 1e-2): the mix of 3 layers, the 4-wide head and
    # the mean cross-entropy over 5 examples
    assert_close_rounding(result.loss, expected, terms=5, depth=3)
    with pytest.raises(LmlabError, match="trains a FeatureHead, not a Linear"):
        objective.prepare(torch.nn.Linear(4, 2))


def test_runs_on_the_trainer_and_is_deterministic(tiny_bert_folder, tmp_path):
    a = train(tiny_bert_folder, tmp_path / "a")
    b = train(tiny_bert_folder, tmp_path / "b")
    assert_same_run(a, b, tmp_path / "a", tmp_path / "b")
    assert [h["epoch"] for h in a["history"]] == [1, 2, 3, 4]
    assert a["stop_reason"] == "epochs" and a["steps"] == 4 * 3  # 40 examples, batches of 16
    assert a["best_epoch"] == max(a["history"], key=lambda h: h["dev_accuracy"])["epoch"]
    assert len(a["scalar_mix"]) == 3 and a["encode_seconds"] > 0
    assert a["selected_by"] == "dev accuracy" and a["train_examples_per_s"] > 0
    run = tmp_path / "a"
    for name in ("config.json", "metrics.jsonl", "report.md"):
        assert (run / name).is_file(), name
    assert [p.name for p in (run / "checkpoints").iterdir()] != []
    config = json.loads((run / "config.json").read_text())
    assert config["hparams"]["recipe"]["name"] == "feature" and config["hparams"]["lr"] == 5e-2
    assert config["model"]["kind"] == "feature_head"
    # the cost report is the encoder's one pass (forward only) over train and dev, every token
    cost = json.loads((run / "cost.json").read_text())
    assert cost == a["cost"] and cost["tokens"] == sum(
        len(f.input_ids) for split in ("train", "dev") for f in encode_examples(
            toy_task(), toy_task().split(split), Tokenizer.from_pretrained(tiny_bert_folder), 128))
    assert cost["flops"] > 0 and "## Cost" in (run / "report.md").read_text()
    other = train(tiny_bert_folder, tmp_path / "seed1", seed=1)
    assert other["history"] != a["history"]


@pytest.mark.parametrize("save_every", [None, 2])  # at the first epoch's end; inside it
def test_resume_after_a_crash_equals_an_uninterrupted_run(tiny_bert_folder, tmp_path,
                                                          monkeypatch, capsys, save_every):
    whole = train(tiny_bert_folder, tmp_path / "whole")
    save = Trainer.save_checkpoint

    def crash_after_first_checkpoint(self):
        path = save(self)
        raise KeyboardInterrupt(f"killed after {path.name}")

    monkeypatch.setattr(Trainer, "save_checkpoint", crash_after_first_checkpoint)
    with pytest.raises(KeyboardInterrupt, match=f"killed after step-{save_every or 3}"):
        train(tiny_bert_folder, tmp_path / "resumed", save_every=save_every)
    monkeypatch.setattr(Trainer, "save_checkpoint", save)
    capsys.readouterr()
    resumed = train(tiny_bert_folder, tmp_path / "resumed", save_every=save_every)
    assert "resuming from" in capsys.readouterr().out  # not started over
    assert_same_run(whole, resumed, tmp_path / "whole", tmp_path / "resumed")


def test_early_stopping_by_patience(tiny_bert_folder, tmp_path):
    # a learning rate too small to change a prediction: dev never improves after epoch 1
    result = train(tiny_bert_folder, tmp_path / "run", epochs=10, lr=1e-12, patience=2)
    assert result["stop_reason"] == "early_stopping"
    assert [h["epoch"] for h in result["history"]] == [1, 2, 3]
    assert result["best_epoch"] == 1 and result["steps"] == 3 * 3
    again = train(tiny_bert_folder, tmp_path / "run", epochs=10, lr=1e-12, patience=2)
    assert (again["stop_reason"], again["steps"]) == ("early_stopping", 9)  # stays stopped
    assert again["history"] == result["history"]
    with pytest.raises(LmlabError, match="other settings.*recipe"):
        train(tiny_bert_folder, tmp_path / "run", epochs=10, lr=1e-12, patience=3)
    with pytest.raises(LmlabError, match="other settings.*encoder"):  # other weights
        train(tiny_bert_folder, tmp_path / "run", epochs=10, lr=1e-12, patience=2,
              random_init=True)


def test_budget_stops_training_and_scores_the_last_partial_epoch(tiny_bert_folder, tmp_path,
                                                                monkeypatch):
    import time

    class TickingClock:  # the Trainer's clock moves 0.05 s per reading: no real timing
        now = 0.0

        def perf_counter(self) -> float:
            self.now += 0.05
            return self.now

        def __getattr__(self, name):
            return getattr(time, name)

    monkeypatch.setattr("lmlab.training.trainer.time", TickingClock())
    model, tokenizer, _ = load_model(tiny_bert_folder)
    result = train_feature_based(toy_task(), model, tokenizer, get_recipe("feature", epochs=10),
                                 0, tmp_path / "run",
                                 RunOptions(budget_seconds=1.0, progress=False))
    assert result["stop_reason"] == "budget" and 0 < result["steps"] < 10 * 3
    assert result["history"][-1]["step"] == result["steps"]  # scored where it stopped


def test_saved_run_loads_in_a_fresh_process_and_scores_the_same(tiny_bert_folder, tmp_path):
    result = train(tiny_bert_folder, tmp_path / "run", layer=-1)
    assert result["scalar_mix"] is None  # one layer: no mix
    result.save(tmp_path / "run" / "model")
    dev = toy_task().split("dev")
    script = """
import json, sys
import lmlab
from lmlab.finetune.runner import load_tokenizer, predict
from lmlab.tasks.types import Example, Task

folder, texts = sys.argv[1], json.loads(sys.argv[2])
model = lmlab.from_pretrained(folder)
examples = [Example(id=str(i), text=t, label=None) for i, t in enumerate(texts)]
task = Task("toy", "classification", ["animal", "tool"], ["accuracy"], {"dev": examples})
print(type(model).__name__)
print(json.dumps(predict(model, load_tokenizer(folder), task, "eval", examples=examples)))
"""
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "run" / "model"),
                          json.dumps([e.text for e in dev])], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    kind, predictions = out.stdout.splitlines()
    assert kind == "FeatureClassifier"
    assert json.loads(predictions) == result.predict("dev")


def test_regression_trains_one_output_with_mse_after_a_bf16_encoder_pass(tiny_bert_folder,
                                                                         tmp_path):
    classes = toy_task()
    splits = {name: [replace(e, label=float(e.label == "animal")) for e in examples]
              for name, examples in classes.splits.items()}
    task = Task("toy-score", "regression", [], ["pearson"], splits)
    model, tokenizer, _ = load_model(tiny_bert_folder)
    result = train_feature_based(task, model, tokenizer, get_recipe("feature", epochs=3, lr=5e-2),
                                 0, tmp_path / "run", RunOptions("bf16", progress=False))
    predictions = result.predict("test")
    assert len(predictions) == len(splits["test"]) and all(isinstance(p, float)
                                                           for p in predictions)
    assert [h["epoch"] for h in result["history"]] == [1, 2, 3]
    assert all("dev_pearson" in h for h in result["history"])
    assert result.predict("dev") == result.predict("dev")  # the kept head, eval mode
    assert json.loads((tmp_path / "run" / "config.json").read_text())["speed"]["precision"] \
        == "bf16"


def test_refuses_token_tasks_and_missing_devices_before_work(tiny_bert_folder, tmp_path):
    model, tokenizer, _ = load_model(tiny_bert_folder)
    recipe = get_recipe("feature")
    with pytest.raises(LmlabError, match="sentence tasks, not tagging"):
        train_feature_based(toy_task(task_type="tagging"), model, tokenizer, recipe, 0,
                            tmp_path / "tag")
    with pytest.raises(LmlabError, match="layer 3 does not exist"):  # 2 layers: 3 states
        train_feature_based(toy_task(), model, tokenizer, replace(recipe, layer=3), 0,
                            tmp_path / "layer")
    if not torch.cuda.is_available():
        with pytest.raises(LmlabError, match="CUDA is not available"):
            train_feature_based(toy_task(), model, tokenizer, recipe, 0, tmp_path / "gpu",
                                RunOptions(device="cuda"))
    assert not any(tmp_path.iterdir())  # nothing written
