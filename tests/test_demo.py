"""Smoke test of the main job: the whole demo on a small corpus slice, about two minutes."""

from __future__ import annotations

import json
import re
import time

import pytest

from lmlab.cli import main
from lmlab.demo.report import VERDICT_RULE, results_table, verdict

ARGS = ["demo", "--budget", "90s", "--max-documents", "150", "--size", "tiny",
        "--max-train-examples", "150", "--max-eval-examples", "60", "--vocab-size", "2000"]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    started = time.perf_counter()
    assert main([*ARGS, "--out", str(out)]) == 0
    return out, time.perf_counter() - started


def test_report_has_every_part(demo_run):
    out, _ = demo_run
    report = (out / "report.md").read_text()
    for heading in ("## Results (test split)", "## Pretraining", "### Cost", "## Words in context",
                    "## Fill-mask", "## Stages", "## Settings"):
        assert heading in report, heading
    assert (out / "pretraining-loss.png").stat().st_size > 1000
    page = (out / "report.html").read_text()
    assert "<table>" in page and "data:image/png;base64," in page
    assert "MFU" in report and "FLOPs" in report
    from lmlab.utils.host import describe_host

    assert describe_host().split(",")[0] in report  # the host beside the run's time


def test_report_numbers_come_from_the_run(demo_run):
    out, _ = demo_run
    summary = json.loads((out / "summary.json").read_text())
    report = (out / "report.md").read_text()
    # every per-seed fine-tuning score in the report is the one its stage recorded on disk
    stage_dirs = sorted((out / "stages").glob("finetune-*"))
    assert len(stage_dirs) == 2 * 2 * 3  # tasks x (pretrained, random) x seeds
    for folder in stage_dirs:
        result = json.loads((folder / "DONE.json").read_text())["result"]
        assert f"{result['test']['accuracy']:.4f}" in report
    for row in results_table(summary["results"]):
        assert f"| {row['task']} | accuracy | " in report
        assert row["verdict"] in report
    # the pretraining cost section is the run's own cost report
    run = summary["pretrain_run"]
    tokens = json.loads(open(f"{run}/cost.json").read())["tokens"]
    assert f"{tokens:,}" in report
    # contextual neighbours were computed from this corpus
    assert re.search(r"### broke \(\d+ corpus occurrences\)", report)


def test_second_run_reuses_every_stage(demo_run):
    out, first_seconds = demo_run
    started = time.perf_counter()
    assert main([*ARGS, "--out", str(out)]) == 0
    seconds = time.perf_counter() - started
    summary = json.loads((out / "summary.json").read_text())
    assert all(stage["cached"] for stage in summary["stages"])
    assert seconds < first_seconds / 3


def test_verdict_rule():
    assert verdict([0.6, 0.62, 0.61], [0.4, 0.42, 0.41])[0] == "pretraining helped"
    assert verdict([0.4, 0.42, 0.41], [0.6, 0.62, 0.61])[0] == "pretraining hurt"
    assert verdict([0.5, 0.6, 0.55], [0.52, 0.58, 0.5])[0] == "no clear difference"
    gain, threshold = verdict([0.5, 0.7, 0.6], [0.4, 0.45, 0.5])[1:]
    assert abs(gain - 0.15) < 1e-9 and abs(threshold - 0.2) < 1e-9  # 0.15 < 0.2: no verdict
    assert "spread" in VERDICT_RULE


def test_demo_rejects_a_tiny_budget(tmp_path, capsys):
    assert main(["demo", "--budget", "5s", "--out", str(tmp_path)]) == 2
    assert "too small" in capsys.readouterr().err
