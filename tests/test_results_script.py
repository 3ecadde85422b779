"""scripts/results.py (docs/results.md) end to end on a tiny model and a toy task: the
learning-rate search picks the best dev score, every system gets a row, reruns skip
finished runs; and the page's pieces (one-class footnotes, the goal verdict)."""

from __future__ import annotations

import importlib.util
import inspect
import shutil
import sys
from pathlib import Path

import pytest
from test_finetune import toy_task

from lmlab.finetune.recipes import RECIPES
from lmlab.finetune.runner import finetune
from lmlab.utils.host import describe_host

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "results.py"


@pytest.fixture(scope="module")
def results():
    spec = importlib.util.spec_from_file_location("results_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["results_script"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("results_script", None)


def _row(system, seed, lr, dev, test=None, one_class=None, wall=1.0):
    return {"system": system, "seed": seed, "lr": lr, "dev": {"accuracy": dev},
            "test": {"accuracy": test if test is not None else dev}, "steps": 10,
            "one_class": one_class or {}, "precision": "bf16", "train_size": 96,
            "wall_seconds": wall}


def _add(runs, row):
    """Put ``row`` into ``runs`` under its key (``lr-LR/seed-N``, or ``seed-N``)."""
    lr = f"lr-{row['lr']:.3g}/" if row["lr"] is not None else ""
    runs[f"{lr}seed-{row['seed']}"] = row


def test_collect_chooses_best_dev_lr_and_counts_time(results):
    runs = {}
    for lr, dev in ((1e-4, 0.6), (2e-4, 0.8), (4e-4, 0.7)):
        _add(runs, _row("minilm-finetuned", 0, lr, dev, wall=10))
    for seed in (1, 2):
        _add(runs, _row("minilm-finetuned", seed, 2e-4, 0.75, wall=10))
    _add(runs, _row("minilm-finetuned", 1, 1e-4, 0.99))  # not the chosen lr: ignored
    found = results.collect(runs, "accuracy")
    assert found["lr"] == 2e-4
    assert [r["seed"] for r in found["rows"]] == [0, 1, 2]
    assert found["wall_seconds"] == pytest.approx(10 * 5 + 1)  # every run, seed 0 once
    tie = {}
    for lr in (4e-4, 1e-4):
        _add(tie, _row("minilm-frozen", 0, lr, 0.5))
    assert results.collect(tie, "accuracy")["lr"] == 1e-4


def test_render_marks_one_class_and_goal(results):
    metrics = {"toy": ["accuracy"]}

    def table(ours):
        return {"minilm-finetuned": {"lr": 1e-4, "search": {1e-4: _row("x", 0, 1e-4, ours)},
                                     "rows": [_row("x", s, 1e-4, ours, one_class={"test": "a"}
                                                   if s else None) for s in (0, 1, 2)],
                                     "wall_seconds": 3},
                "minilm-frozen": {"lr": None, "search": {}, "rows": [_row("y", 0, 2e-3, 0.6)],
                                  "wall_seconds": 1},
                "tfidf": {"lr": None, "search": {}, "rows": [{**_row("tfidf", 0, None, 0.5),
                                                              "chosen": 10.0}],
                          "wall_seconds": 1},
                "hf-trainer": {"lr": None, "search": {}, "rows": [], "wall_seconds": 0}}

    page = results.render({"toy": table(0.7)}, metrics, "intro")
    assert "| hf-trainer | not run yet |" in page
    assert "Goal met" in page and "minilm-finetuned [1]" in page
    assert "1. minilm-finetuned: seeds 1, 2 predicted a single class (test: 'a')." in page
    assert "| tfidf | C 10 |" in page
    assert "Goal NOT met" in results.render({"toy": table(0.55)}, metrics, "intro")


@pytest.mark.skipif("scratch" not in RECIPES, reason="needs the bert/scratch recipes chosen by "
                    "finetune(recipe=None) (issue #13, part 1)")
def test_script_end_to_end_and_rerun_skips(results, tiny_bert_folder, tmp_path, monkeypatch):
    monkeypatch.setattr(results, "TASKS", ("toy",))
    monkeypatch.setattr(results, "load_builtin_task", lambda name, size: toy_task(32, 8))
    monkeypatch.setattr(results, "minilm_dir", lambda: tiny_bert_folder)
    overrides = {"epochs": 1, "batch_size": 16}
    if "min_updates" in inspect.signature(finetune).parameters:
        overrides["min_updates"] = 1
    extra = {"overrides": overrides, "hf_overrides": {"num_train_epochs": 1}}
    out = tmp_path / "results.md"
    rows = tmp_path / "rows.json"
    argv = ["--tasks", "toy", "--seeds", "0,1", "--lr-factors", "0.1,10", "--runs",
            str(tmp_path / "runs"), "--rows", str(rows), "--out", str(out),
            "--precision", "fp32"]
    page = results.main(argv, extra)
    assert describe_host() in page and out.read_text() == page
    for system in results.DEFAULT_SYSTEMS:
        assert f"| {system} " in page, system
    for system in (*results.PEFT_SYSTEMS, *results.STUDENT_SYSTEMS):  # not run: not shown
        assert system not in page, system
    for system in results.SEARCHED:
        found = results.collect(results.RowStore(rows).of("toy", system), "accuracy")
        assert len(found["search"]) == 2
        best = max(r["dev"]["accuracy"] for r in found["search"].values())
        assert found["search"][found["lr"]]["dev"]["accuracy"] == best
        assert [(r["seed"], r["lr"]) for r in found["rows"]] == [(0, found["lr"]),
                                                                  (1, found["lr"])]
        assert not list((tmp_path / "runs" / "toy" / system).glob("lr-*/seed-*/checkpoints"))

    def refuse(*args, **kwargs):
        raise AssertionError("a finished run ran again")

    monkeypatch.setattr(results, "finetune", refuse)
    monkeypatch.setattr(results, "run_tfidf_baseline", refuse)
    monkeypatch.setattr("results_hf_trainer.run_hf_trainer", refuse)
    assert results.main(argv, extra) == page
    # a fresh checkout has the tracked rows but not the runs' folders: nothing runs again
    shutil.rmtree(tmp_path / "runs")
    assert results.main(argv, extra) == page
    # rows of other settings are not taken for these: a quick look must use its own files
    with pytest.raises(SystemExit, match="training examples"):
        results.main([*argv, "--max-train-examples", "16"], extra)


def test_peft_and_student_systems_run_and_get_their_summary(results, tiny_bert_folder, tmp_path,
                                                            monkeypatch):
    """--systems minilm-lora,student-copied: the method reaches finetune (an adapter is
    trained), the student folder is the model, the rows say so, and the summaries compare them
    with full fine-tuning (their share of its score); a student system without its folder is
    refused before any work."""
    monkeypatch.setattr(results, "TASKS", ("toy",))
    monkeypatch.setattr(results, "load_builtin_task", lambda name, size: toy_task(32, 8))
    monkeypatch.setattr(results, "minilm_dir", lambda: tiny_bert_folder)
    calls = []
    real = results.finetune

    def spy(task, model, out, **kwargs):
        calls.append((str(model), kwargs["method"]))
        return real(task, model, out, **kwargs)

    monkeypatch.setattr(results, "finetune", spy)
    extra = {"overrides": {"epochs": 1, "batch_size": 16, "min_updates": 1}}
    rows = tmp_path / "rows.json"
    argv = ["--tasks", "toy", "--seeds", "0", "--runs", str(tmp_path / "runs"), "--rows",
            str(rows), "--out", str(tmp_path / "results.md"), "--precision", "fp32"]
    with pytest.raises(SystemExit):
        results.main([*argv, "--systems", "student-copied"], extra)
    assert not calls
    page = results.main([*argv, "--systems", "minilm-finetuned,minilm-lora,student-copied",
                         "--lr-factors", "1", "--student-copied", str(tiny_bert_folder)], extra)
    assert calls[-2:] == [(str(tiny_bert_folder), "lora"), (str(tiny_bert_folder), None)]
    stored = results.RowStore(rows)
    assert stored.get("toy/minilm-lora/seed-0")["method"] == "lora"
    assert stored.get("toy/student-copied/seed-0")["model"] == "student-copied"
    assert "## Parameter-efficient fine-tuning" in page and "## Distillation" in page
    full = stored.get("toy/minilm-finetuned/lr-0.0001/seed-0")["test"]["accuracy"]
    lora = stored.get("toy/minilm-lora/seed-0")["test"]["accuracy"]
    if full:
        assert f"| minilm-lora | {100 * lora:.1f} ({100 * lora / full:.0f}%) |" in page
    assert "minilm-bitfit" not in page  # not run: neither in the tables nor the summaries
