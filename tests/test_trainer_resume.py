"""Exact resume: a run killed with SIGKILL and restarted logs the losses of an uninterrupted run.

Dropout is on (0.1), so this also checks that the dropout RNG is restored, and the data stream
position, optimizer moments and schedule step are too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from lmlab.training.metrics_log import read_metrics

TESTS = Path(__file__).resolve().parent

SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from test_trainer import TinyMLM, TinyStream, tiny_model, make_batch
from lmlab.training.config import TrainingConfig
from lmlab.training.trainer import Trainer

cfg = TrainingConfig(lr=2e-3, warmup_steps=3, max_steps=12, log_every=1, save_every=3,
                     eval_every=4, keep_last=2, progress=False, seed=7)
trainer = Trainer(tiny_model(dropout=0.1), TinyMLM(), TinyStream(delay=float(sys.argv[2])),
                  cfg, sys.argv[1], eval_batches=[make_batch(0, 4, 16, 5)], track_cost=False)
trainer.train()
"""


def _launch(script: Path, out: Path, delay: float) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", LMLAB_NO_PROGRESS="1")
    return subprocess.Popen([sys.executable, str(script), str(out), str(delay)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _records(run_dir: Path, kind: str) -> list[tuple[int, float]]:
    key = "loss" if kind == "train" else "eval_loss"
    return [(r["step"], r[key]) for r in read_metrics(run_dir / "metrics.jsonl")
            if r["kind"] == kind]


def test_sigkill_and_resume_logs_identical_losses(tmp_path):
    script = tmp_path / "train_tiny.py"
    script.write_text(SCRIPT.format(tests=str(TESTS)))

    reference = _launch(script, tmp_path / "reference", 0.0)
    killed_dir = tmp_path / "killed"
    victim = _launch(script, killed_dir, 0.25)
    deadline = time.time() + 120
    while not (killed_dir / "checkpoints" / "step-6").is_dir():
        assert victim.poll() is None, victim.communicate()[0]
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.02)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL
    assert not (killed_dir / "checkpoints" / "step-12").exists()
    logged_before_kill = _records(killed_dir, "train")
    assert 6 <= logged_before_kill[-1][0] < 12

    out, _ = reference.communicate(timeout=120)
    assert reference.returncode == 0, out
    resumed = _launch(script, killed_dir, 0.0)
    out, _ = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, out
    assert "resuming from" in out

    ref_train, got_train = _records(tmp_path / "reference", "train"), _records(killed_dir, "train")
    assert [s for s, _ in got_train] == list(range(1, 13))
    assert [s for s, _ in ref_train] == list(range(1, 13))
    for (step, a), (_, b) in zip(ref_train, got_train):
        # exact: a resumed run repeats the uninterrupted run's steps op for op
        assert a == b, f"step {step}: uninterrupted {a} vs resumed {b}"
    assert _records(tmp_path / "reference", "eval") == _records(killed_dir, "eval")
