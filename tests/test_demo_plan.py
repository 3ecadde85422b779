"""How the demo shares its budget: the host's measured speed sets how long pretraining runs,
never how long a model is fine-tuned (the comparison must not depend on the CPU)."""

from __future__ import annotations

import pytest

from lmlab.demo.job import PRETRAIN_SHARE_RANGE, REPORT_RESERVE, DemoConfig, plan_pretraining
from lmlab.demo.stages import StageLog, StageRunner


def test_pretraining_gets_what_the_measured_stages_leave():
    plan = plan_pretraining(1200.0, spent=400.0, expected=300.0)
    assert plan["pretrain_seconds"] == round(1200 * (1 - REPORT_RESERVE) - 400 - 300)
    assert plan["limited_by"] == "the budget"


def test_pretraining_share_is_bounded():
    low, high = PRETRAIN_SHARE_RANGE
    slow = plan_pretraining(1200.0, spent=700.0, expected=600.0)  # a host too slow for the plan
    assert slow["pretrain_seconds"] == round(low * 1200) and slow["limited_by"] == "the lower bound"
    fast = plan_pretraining(1200.0, spent=60.0, expected=40.0)
    assert fast["pretrain_seconds"] == round(high * 1200) and fast["limited_by"] == "the upper bound"


def test_a_slower_host_pretrains_shorter_and_fine_tunes_the_same():
    """Twice the stage times: less pretraining; the fine-tuning settings are the config's."""
    quick = plan_pretraining(1200.0, spent=300.0, expected=250.0)
    slow = plan_pretraining(1200.0, spent=400.0, expected=300.0)
    assert slow["pretrain_seconds"] < quick["pretrain_seconds"]
    assert DemoConfig().finetune_tokens > 0


def test_recorded_seconds_are_read_back_from_cached_stages(tmp_path):
    """A rerun sees the times the stages took when they ran, so it plans the same pretraining
    seconds and finds the pretraining stage it ran before."""
    first = StageLog()
    runner = StageRunner(tmp_path, log=first)
    runner.run("finetune-a-random-seed0", {"x": 1}, lambda folder: {"ok": True})
    runner.run("tfidf-a-seed0", {"x": 1}, lambda folder: {"ok": True})
    again = StageLog()
    rerun = StageRunner(tmp_path, log=again)

    def must_not_run(folder):
        raise AssertionError("a finished stage ran again")

    rerun.run("finetune-a-random-seed0", {"x": 1}, must_not_run)
    rerun.run("tfidf-a-seed0", {"x": 1}, must_not_run)
    assert [e["cached"] for e in again.entries] == [True, True]
    assert again.recorded_seconds() == pytest.approx(first.recorded_seconds())
    assert again.recorded_seconds("finetune-", "-random-") == \
        first.entries[0]["recorded_seconds"]
    assert all(e["seconds"] == 0.0 for e in again.entries)


def test_fine_tuning_length_is_whole_epochs_of_the_same_tokens(minilm_dir):
    """Every run trains on about ``finetune_tokens`` tokens, in whole epochs: the short
    WordNet definitions get more epochs than the longer fortunes, never fewer than one."""
    from lmlab.demo.job import finetune_epochs
    from lmlab.finetune.data import encode_examples
    from lmlab.finetune.runner import _subset, load_tokenizer
    from lmlab.tasks.builtin import load_builtin_task

    config = DemoConfig(max_train_examples=400)
    tokenizer = load_tokenizer(minilm_dir)
    epochs = {}
    for name in ("wordnet-supersense", "fortunes-topic"):
        task = load_builtin_task(name, "cpu")
        epochs[name] = finetune_epochs(config, task, minilm_dir)
        examples = _subset(task, config.max_train_examples).split("train")
        per_epoch = sum(map(len, encode_examples(task, examples, tokenizer)))
        assert abs(epochs[name] * per_epoch - config.finetune_tokens) <= per_epoch / 2 + 1
    assert epochs["wordnet-supersense"] > epochs["fortunes-topic"] >= 1
    tiny = DemoConfig(max_train_examples=400, finetune_tokens=1)
    assert finetune_epochs(tiny, load_builtin_task("fortunes-topic", "cpu"), minilm_dir) == 1
