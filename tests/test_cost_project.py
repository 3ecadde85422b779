"""`lmlab cost project DIR`: a folder of small real runs (a sweep of seeds and learning rates, a
diverged run, a resumed run, a killed run, an untracked run and the final run) summed by hand:
each run counted once with all its sessions, beside the final run (Strubell et al.'s "with
tuning")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import assert_clean_refusal, run_lmlab_here
from test_trainer import TinyMLM, TinyStream, tiny_model

from lmlab.cost.flops import flops_per_token
from lmlab.cost.report import SESSIONS_FILE
from lmlab.training.config import TrainingConfig
from lmlab.training.project import project_cost
from lmlab.training.trainer import Trainer
from lmlab.utils.errors import LmlabError

TOKENS_PER_STEP = 8 * 16  # TinyStream: 8 sequences of 16 tokens, no padding


def _train(out: Path, steps: int, objective=None, track_cost: bool = True, **overrides):
    cfg = TrainingConfig(**{"lr": 1e-3, "max_steps": steps, "batch_size": 8, "seq_len": 16,
                            "progress": False, "log_every": 1, **overrides})
    return Trainer(tiny_model(dropout=0.0), objective or TinyMLM(), TinyStream(), cfg, out,
                   track_cost=track_cost, measure_peak=False, save_model=False).train()


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """27 counted steps in 10 runs (one untracked, one started over), 5 the final run's."""
    root = tmp_path_factory.mktemp("project")
    for lr, seed in ((1e-3, 0), (1e-3, 1), (3e-3, 0)):  # a sweep: 3 steps each
        _train(root / "sweep" / f"lr{lr:g}" / f"seed{seed}", 3, lr=lr, seed=seed)
    with pytest.raises(LmlabError, match="diverged"):  # NaN loss at step 3: 2 steps counted
        _train(root / "failed", 5, objective=TinyMLM(nan_at_call=3))
    _train(root / "resumed", 2)  # two sessions: 2 steps, then extended to 4
    _train(root / "resumed", 4)
    _train(root / "killed", 3, save_every=1)  # killed after its step-2 checkpoint:
    sessions = root / "killed" / SESSIONS_FILE  # the final record never written
    sessions.write_text("".join(sessions.read_text().splitlines(keepends=True)[:-1]))
    _train(root / "untracked", 2, track_cost=False)
    _train(root / "redone", 2)  # started over (--overwrite): its 2 steps stay counted apart
    from lmlab.training.run_dir import remove_run

    remove_run(root / "redone")
    _train(root / "redone", 3)
    _train(root / "final", 5)
    return root


def test_project_total_equals_the_hand_count(project):
    config = tiny_model().config
    per_token = flops_per_token(config, 16, head="mlm", sparse_prediction_fraction=0.15)
    result = project_cost(project, final=project / "final", price_per_hour=3.6)
    runs = {r.run: r for r in result.runs}
    assert sorted(runs) == ["failed", "final", "killed", "redone", "redone (started over, 1)",
                            "resumed", "sweep/lr0.001/seed0", "sweep/lr0.001/seed1",
                            "sweep/lr0.003/seed0", "untracked"]
    steps = {"failed": 2, "final": 5, "killed": 2, "resumed": 4, "sweep/lr0.001/seed0": 3,
             "sweep/lr0.001/seed1": 3, "sweep/lr0.003/seed0": 3, "untracked": 0, "redone": 3,
             "redone (started over, 1)": 2}
    for name, count in steps.items():
        assert runs[name].tokens == count * TOKENS_PER_STEP, name
        assert runs[name].flops == pytest.approx(count * TOKENS_PER_STEP * per_token, rel=1e-12)
    assert [runs[n].status for n in ("failed", "killed", "untracked", "final")] == [
        "failed", "interrupted", "untracked", "finished"]
    assert runs["resumed"].sessions == 2 and runs["untracked"].sessions == 0
    total = result.total()
    assert total["tokens"] == 27 * TOKENS_PER_STEP
    assert total["flops"] == pytest.approx(27 * TOKENS_PER_STEP * per_token, rel=1e-12)
    assert result.final.run == "final" and result.tuning_factor("flops") == pytest.approx(27 / 5)
    # time, money and energy: the sum of every session's own record, priced at $3.6/hour
    records = [json.loads(line) for path in project.rglob("cost-sessions*.jsonl")
               for line in path.read_text().splitlines()]
    newest = {r["session"]: r for r in records}
    seconds = sum(r["wall_seconds"] for r in newest.values())
    assert len(newest) == 10 and total["seconds"] == pytest.approx(seconds, rel=1e-12)
    assert total["money"] == pytest.approx(seconds / 1000, rel=1e-12)
    assert total["energy_kwh"] == pytest.approx(
        sum(r["energy_joules"] for r in newest.values()) / 3.6e6, rel=1e-12)
    assert "untracked" in " ".join(result.notes)


def test_cost_project_cli_writes_table_plot_and_json(project, tmp_path):
    out = tmp_path / "report" / "cost.png"
    result = run_lmlab_here("cost", "project", project, "--out", out, "--final", "resumed")
    assert result.returncode == 0, result.stderr
    assert "| final run: resumed |" in result.stdout and "With tuning" in result.stdout
    assert out.stat().st_size > 5000 and out.with_suffix(".md").is_file()
    saved = json.loads(out.with_suffix(".json").read_text())
    assert saved["final"] == "resumed" and saved["with_tuning"]["flops"] == pytest.approx(27 / 4)
    # without --final: the finished run that ended last
    assert project_cost(project).final.run == "final"
    assert "| redone (started over, 1) | finished | 1 | 256 |" in result.stdout


def test_cost_project_refusals(project, tmp_path):
    assert_clean_refusal(run_lmlab_here("cost", "project", tmp_path / "none"), "DIR")
    assert_clean_refusal(run_lmlab_here("cost", "project", project, "--final", "nope"),
                         "not one of the runs")
    (tmp_path / "empty").mkdir()
    assert_clean_refusal(run_lmlab_here("cost", "project", tmp_path / "empty"),
                         "holds no run folder")
    assert_clean_refusal(run_lmlab_here("cost", "project", project, "--price-per-hour", "-1"),
                         "price_per_hour")


@pytest.mark.slow
def test_the_sweep_script_at_a_toy_size(tmp_path):
    """scripts/cost_project_sweep.py (docs/cost.md's table) with one step per run: six sweep
    runs of one step and the final run of two sessions, two steps: the project is 4x the final
    run in FLOPs."""
    import os
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "scripts" / "cost_project_sweep.py"
    result = subprocess.run([sys.executable, str(script), "--steps", "1", "--out",
                             str(tmp_path / "p"), "--plot", str(tmp_path / "cost.png")],
                            capture_output=True, text=True, timeout=600,
                            env={**os.environ, "LMLAB_NO_PROGRESS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| **all 7 runs** |  | 8 |" in result.stdout and "FLOPs x4.00" in result.stdout
    assert (tmp_path / "cost.png").stat().st_size > 5000
