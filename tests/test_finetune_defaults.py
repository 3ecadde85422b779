"""The fine-tuning defaults: pooling that follows the checkpoint, a head learning-rate multiplier,
a minimum number of updates, the recipe for random init, and one-class predictors reported."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from test_finetune import toy_task

from lmlab.finetune.pooling import resolve_pooling
from lmlab.finetune.recipes import RECIPES, discriminative_groups, epochs_for, get_recipe
from lmlab.finetune.runner import finetune, load_model, one_class_label
from lmlab.utils.catalog import minilm_dir


def _write_pooling(folder, **modes):
    (folder / "1_Pooling").mkdir(parents=True, exist_ok=True)
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"}]))
    config = {"word_embedding_dimension": 8, "pooling_mode_cls_token": False,
              "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False}
    config.update({f"pooling_mode_{k}": v for k, v in modes.items()})
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(config))


def test_pooling_follows_the_checkpoint(tmp_path):
    mean = tmp_path / "mean"
    _write_pooling(mean, mean_tokens=True)
    assert resolve_pooling("auto", mean, has_pooler=True)[0] == "mean"
    cls = tmp_path / "cls"
    _write_pooling(cls, cls_token=True)
    assert resolve_pooling("auto", cls, has_pooler=False)[0] == "family"
    plain = tmp_path / "plain"
    plain.mkdir()
    assert resolve_pooling("auto", plain, has_pooler=True)[0] == "family"  # NSP-trained pooler
    assert resolve_pooling("auto", plain, has_pooler=False)[0] == "mean"
    assert resolve_pooling("auto", mean, has_pooler=True, random_init=True)[0] == "mean"
    assert resolve_pooling("cls", mean, has_pooler=True) == ("cls", "chosen by the caller")
    # the real all-MiniLM-L6-v2 folder says mean, and why
    pooling, reason = resolve_pooling("auto", minilm_dir(), has_pooler=True)
    assert pooling == "mean" and "1_Pooling" in reason


def test_head_lr_multiplier_in_the_optimizer_groups(tiny_bert_folder):
    model, _, _ = load_model(tiny_bert_folder)
    from lmlab.models.task_heads import add_task_head

    add_task_head(model, "sequence-classification", 3, pooling="mean")
    groups = discriminative_groups(model, 1e-4, 1.0, 0.01, head_lr_multiplier=10.0)
    head_ids = {id(p) for p in model.heads.parameters()}
    for group in groups:
        in_head = {id(p) in head_ids for p in group["params"]}
        assert len(in_head) == 1  # a group is all head or all body
        assert group["lr"] == pytest.approx(1e-3 if in_head.pop() else 1e-4)
    counted = sum(len(g["params"]) for g in groups)
    assert counted == len([p for p in model.parameters() if p.requires_grad])


def test_min_updates_sets_the_length():
    rec = get_recipe("bert", epochs=3, min_updates=500)
    assert epochs_for(rec, 100) == 5  # 3 epochs would be 300 updates
    assert epochs_for(rec, 250) == 3
    assert epochs_for(get_recipe("bert-paper"), 1) == 3


def test_paper_recipe_is_kept_by_name():
    paper = RECIPES["bert-paper"]
    assert (paper.lr, paper.epochs, paper.batch_size, paper.pooling) == (5e-5, 3, 32, "family")
    assert paper.head_lr_multiplier == 1.0 and paper.min_updates == 0


def test_defaults_train_min_updates_and_pick_scratch_for_random(tiny_bert_folder, tmp_path):
    task = toy_task(32, 8)  # batch 16: 2 updates per epoch
    result = finetune(task, tiny_bert_folder, tmp_path / "run", min_updates=7, patience=20,
                      save_model=False, show_progress=False)
    assert result["recipe"]["name"] == "bert" and result["planned_epochs"] == 4  # ceil(7 / 2)
    steps = [json.loads(line)["step"] for line in
             (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if json.loads(line).get("kind") == "train"]
    assert max(steps) == 8
    assert result["pooling"] == "family" and "pooler" in result["pooling_reason"]
    random_run = finetune(task, f"random:{tiny_bert_folder}", tmp_path / "random", epochs=1,
                          save_model=False, show_progress=False)
    assert random_run["recipe"]["name"] == "scratch" and random_run["random_init"]
    assert "random" in random_run["recipe_reason"]
    named = finetune(task, tiny_bert_folder, tmp_path / "named", recipe="bert-paper", epochs=1,
                     save_model=False, show_progress=False)
    assert named["recipe_reason"] == "chosen by the caller"


def test_one_class_predictions_are_reported():
    task = toy_task(8, 4)
    assert one_class_label(task, ["tool"] * 4) == "tool"
    assert one_class_label(task, ["tool", "animal", "tool", "tool"]) is None
    assert one_class_label(toy_task(8, 4, "tagging"), [["O"]] * 4) is None


def test_one_class_run_is_recorded(tiny_bert_folder, tmp_path):
    # every training example is a tool: the classifier learns to say "tool" for everything
    task = toy_task(32, 8)
    from dataclasses import replace

    task = replace(task, splits={**task.splits, "train": [replace(e, label="tool")
                                                          for e in task.split("train")]})
    with pytest.warns(UserWarning, match="collapsed onto one class"):
        result = finetune(task, tiny_bert_folder, tmp_path / "flat", epochs=3, lr=1e-3,
                          save_model=False, show_progress=False)
    assert result["one_class"] == {"dev": "tool", "test": "tool"}
    saved = json.loads((tmp_path / "flat" / "metrics.json").read_text())
    assert saved["one_class"] == result["one_class"]


@pytest.mark.parametrize("flag,value", [("--min-updates", "-1"),
                                        ("--head-lr-multiplier", "0")])
def test_cli_refuses_bad_values_before_work(tmp_path, flag, value):
    shutil.rmtree(tmp_path / "out", ignore_errors=True)
    done = subprocess.run([sys.executable, "-m", "lmlab", "finetune", "--task",
                           "wordnet-supersense", "--model", str(tmp_path / "missing"), "--out",
                           str(tmp_path / "out"), flag, value], capture_output=True, text=True)
    assert done.returncode != 0 and flag in done.stderr
    assert not (tmp_path / "out").exists()
