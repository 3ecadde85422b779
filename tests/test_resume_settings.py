"""Resuming refuses what changes a run's result beyond the hyperparameters: the precision (the
one ``auto`` resolved to) and, before the run has ended, the limits its learning-rate schedule
is built on. Extending a finished run stays allowed.

The CLI cases run ``lmlab pretrain`` through the CLI's ``main`` in this process (conftest's
``run_lmlab_here``: two-step runs, where a Python and torch start-up would be most of the cost)
and check a clean refusal (exit 2, the problem and the fix) with the run folder byte for byte
and time for time unchanged.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import assert_clean_refusal, disk_snapshot, kjv_shards, run_lmlab_here

from lmlab.utils.errors import LmlabError


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return kjv_shards(tmp_path_factory, train=12, validation=2)


def _pretrain(shards: Path, out: Path, *flags: str):
    return run_lmlab_here("pretrain", "--family", "bert", "--size", "tiny", "--objective", "mlm",
                     "--shards", shards, "--seq-len", 32, "--batch-size", 2, "--lr", "1e-3",
                     "--eval-batches", 1, "--no-cost", "--out", out, *flags)


def _refused(result, run: Path, before: dict, *problem: str) -> str:
    error = assert_clean_refusal(result, *problem, fix="--overwrite")
    assert disk_snapshot(run) == before, "the refusal changed the run folder"
    return error


def _precision(run: Path) -> str:
    return json.loads((run / "config.json").read_text())["speed"]["precision"]


def test_resume_compares_the_precision_auto_resolved_to(shards, tmp_path):
    """A run made with ``--precision auto`` records what auto chose on this host (fp32 or
    bf16); resuming it in the other precision is refused, and so is resuming a run made in
    the other precision with ``auto`` (compared once auto is resolved, before any step)."""
    auto_run, other_run = tmp_path / "auto", tmp_path / "other"
    assert _pretrain(shards, auto_run, "--steps", 2, "--precision", "auto").returncode == 0
    chosen = _precision(auto_run)
    other = {"fp32": "bf16", "bf16": "fp32"}[chosen]

    before = disk_snapshot(auto_run)
    _refused(_pretrain(shards, auto_run, "--steps", 2, "--precision", other), auto_run, before,
             f"precision: '{chosen}' -> '{other}'")

    assert _pretrain(shards, other_run, "--steps", 2, "--precision", other).returncode == 0
    before = disk_snapshot(other_run)
    _refused(_pretrain(shards, other_run, "--steps", 2, "--precision", "auto"), other_run,
             before, f"precision: '{other}' -> '{chosen}'")

    # the precision auto chose, given by name, is the run's: it resumes (and, finished, ends)
    result = _pretrain(shards, auto_run, "--steps", 2, "--precision", chosen)
    assert result.returncode == 0, result.stderr
    assert "resuming from" in result.stdout


def test_an_unfinished_run_keeps_the_limits_its_schedule_is_built_on(shards, tmp_path):
    """A run killed between checkpoints (its final checkpoint removed: what a SIGKILL during
    steps 3-4 leaves) is refused another step limit or time budget, since a linear decay over
    another horizon gives every later step another learning rate; resumed with its own limits it
    finishes, its final checkpoint saying so (a finished run may then be extended:
    tests/test_trainer_cli.py)."""
    run = tmp_path / "run"
    limits = ("--steps", 4, "--budget", "1h", "--save-every", 2, "--precision", "fp32")
    assert _pretrain(shards, run, *limits).returncode == 0
    shutil.rmtree(run / "checkpoints" / "step-4")
    periodic = json.loads((run / "checkpoints" / "step-2" / "state.json").read_text())
    assert "stop_reason" not in periodic  # only the final checkpoint says the run ended

    before = disk_snapshot(run)
    error = _refused(_pretrain(shards, run, "--steps", 8, "--budget", "1h", "--save-every", 2,
                               "--precision", "fp32"), run, before, "max_steps: 4 -> 8")
    assert "not reached its end" in error
    _refused(_pretrain(shards, run, "--steps", 4, "--budget", "2h", "--save-every", 2,
                       "--precision", "fp32"), run, before, "budget_seconds: 3600.0 -> 7200.0")

    result = _pretrain(shards, run, *limits)  # its own limits: it resumes and ends
    assert result.returncode == 0, result.stderr
    assert "resuming from" in result.stdout and "step 2" in result.stdout
    state = json.loads((run / "checkpoints" / "step-4" / "state.json").read_text())
    assert state["step"] == 4 and state["stop_reason"] == "max_steps"


# -- the rule itself, on hand-made run folders (no training) -----------------------------------
def _run_folder(root: Path, hparams: dict, state: dict, precision: str = "fp32") -> Path:
    """A run folder as the Trainer leaves it: config.json and one checkpoint's state.json."""
    config = {"hparams": {"lr": 1e-3, "schedule": "linear", "warmup_steps": None,
                          "warmup_fraction": 0.0, "min_lr_ratio": 0.0, "cut_frac": 0.1,
                          "ratio": 32.0, "max_steps": 100, "max_tokens": None,
                          "budget_seconds": None, **hparams},
              "speed": {"precision": precision}}
    (root / "checkpoints" / f"step-{state['step']}").mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config))
    (root / "checkpoints" / f"step-{state['step']}" / "state.json").write_text(
        json.dumps({"tokens": 0, "elapsed": 1.0, **state}))
    return root


def _with(run: Path, **changes) -> dict:
    config = json.loads((run / "config.json").read_text())
    for key, value in changes.items():
        config["speed" if key == "precision" else "hparams"][key] = value
    return config


@pytest.mark.parametrize("hparams,changes,refused", [
    # linear decay: the step limit is the horizon
    ({}, {"max_steps": 200}, True),
    ({}, {"max_steps": 50}, True),
    ({}, {"budget_seconds": 600}, True),  # a budget shorter than the steps: another horizon
    ({"budget_seconds": 600}, {"budget_seconds": 1200}, True),
    ({"budget_seconds": 600}, {"budget_seconds": 600.0}, False),  # "10m" and 600: the same
    ({"schedule": "cosine"}, {"max_tokens": 10**6}, True),
    ({"schedule": "triangular"}, {"max_steps": 200}, True),
    # a warmup over a fraction of the run follows the horizon too
    ({"schedule": "constant", "warmup_fraction": 0.1}, {"max_steps": 200}, True),
    # constant or inverse-sqrt warmed up over steps: every step's LR is the same either way
    ({"schedule": "constant"}, {"max_steps": 200}, False),
    ({"schedule": "inverse_sqrt", "warmup_steps": 10}, {"budget_seconds": 60}, False),
    ({"schedule": "constant", "warmup_steps": 10, "warmup_fraction": 0.1}, {"max_steps": 7},
     False),
])
def test_which_limit_changes_an_unfinished_run_refuses(tmp_path, hparams, changes, refused):
    from lmlab.training.run_dir import check_resumable

    run = _run_folder(tmp_path, hparams, {"step": 40})
    if refused:
        with pytest.raises(LmlabError, match=next(iter(changes))) as info:
            check_resumable(run, _with(run, **changes))
        assert "finish it first" in info.value.fix and "--overwrite" in info.value.fix
    else:
        check_resumable(run, _with(run, **changes))


@pytest.mark.parametrize("state", [
    {"step": 100, "stop_reason": "max_steps"},
    {"step": 40, "stop_reason": "budget"},
    {"step": 40, "stop_reason": "early_stopping"},
    {"step": 100},  # a checkpoint from before stop reasons were recorded: at its step limit
])
def test_a_run_that_has_ended_may_change_its_limits(tmp_path, state):
    from lmlab.training.run_dir import check_resumable

    run = _run_folder(tmp_path, {}, state)
    check_resumable(run, _with(run, max_steps=300, budget_seconds=3600))


def test_precision_is_compared_and_auto_is_left_to_the_trainer(tmp_path):
    from lmlab.training.run_dir import check_resumable

    run = _run_folder(tmp_path, {}, {"step": 40}, precision="bf16")
    with pytest.raises(LmlabError, match="precision: 'bf16' -> 'fp32'"):
        check_resumable(run, _with(run, precision="fp32"))
    check_resumable(run, _with(run, precision="auto"))  # compared once resolved
    check_resumable(run, _with(run, precision="bf16"))
