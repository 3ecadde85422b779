"""DDP (and FSDP) on CPU with gloo: 2 processes at per-rank batch B/2 reproduce one process at
batch B, and only rank 0 writes logs and checkpoint files."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import rounding_tolerance
from test_trainer import TinyMLM, TinyStream, make_batch, run, tiny_model

from lmlab.training.metrics_log import read_metrics

TESTS = Path(__file__).resolve().parent
STEPS = 5
# Float sums in another order (all-reduce of two half-batch gradients): the rounding of losses
# (at most ln 97 < 5) over 97 words, through STEPS steps of 2 layers forward and back.
TOLERANCE = rounding_tolerance(terms=97, depth=STEPS * 2 * 2, scale=5.0)

SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from test_trainer import TinyMLM, TinyStream, tiny_model, make_batch
from lmlab.training.config import TrainingConfig
from lmlab.training.trainer import Trainer

cfg = TrainingConfig(lr=2e-3, warmup_steps=2, max_steps={steps}, log_every=1, save_every=2,
                     eval_every=3, progress=False, seed=3, strategy=sys.argv[2])
trainer = Trainer(tiny_model(dropout=0.0), TinyMLM(), TinyStream(batch_size=8), cfg, sys.argv[1],
                  eval_batches=[make_batch(0, 4, 16, 5)], track_cost=False)
trainer.train()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(tmp_path: Path, out: Path, strategy: str) -> subprocess.CompletedProcess:
    script = tmp_path / "ddp_tiny.py"
    script.write_text(SCRIPT.format(tests=str(TESTS), steps=STEPS))
    env = dict(os.environ, OMP_NUM_THREADS="1", LMLAB_NO_PROGRESS="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
               str(script), str(out), strategy]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def _losses(run_dir: Path, kind: str = "train", key: str = "loss") -> list[float]:
    return [r[key] for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == kind]


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("single")
    run(tmp, "single", model=tiny_model(dropout=0.0), stream=TinyStream(batch_size=8),
        objective=TinyMLM(), eval_batches=[make_batch(0, 4, 16, 5)], lr=2e-3, warmup_steps=2,
        max_steps=STEPS, save_every=2, eval_every=3, seed=3)
    return tmp / "single"


@pytest.mark.parametrize("strategy", ["ddp", pytest.param("fsdp", marks=pytest.mark.slow)])
def test_two_processes_match_one_process(tmp_path, single_process, strategy):
    out = tmp_path / strategy
    result = _torchrun(tmp_path, out, strategy)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    expected, got = _losses(single_process), _losses(out)
    assert len(got) == STEPS, "every step is logged exactly once (rank 0 only)"
    for step, (a, b) in enumerate(zip(expected, got), start=1):
        assert abs(a - b) < TOLERANCE, f"step {step}: 1 process {a}, 2 processes {b}"
    assert [r["tokens"] for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "train"] \
        == [8 * 16 * s for s in range(1, STEPS + 1)]
    for a, b in zip(_losses(single_process, "eval", "eval_loss"), _losses(out, "eval", "eval_loss")):
        assert abs(a - b) < TOLERANCE
    final = out / "checkpoints" / f"step-{STEPS}"
    names = sorted(p.name for p in final.iterdir())
    assert names == ["model.safetensors", "optimizer.pt", "rng-rank0.pt", "rng-rank1.pt",
                     "state.json"]
    assert not list((out / "checkpoints").glob("*.tmp"))
    # the checkpoint holds full (unsharded) weights equal to the single-process run's
    from lmlab.training.checkpoint import load_state

    ours = load_state(final / "model.safetensors")
    reference = load_state(single_process / "checkpoints" / f"step-{STEPS}" / "model.safetensors")
    assert ours.keys() == reference.keys()
    for key in ours:
        torch.testing.assert_close(ours[key], reference[key], atol=1e-5, rtol=1e-4)
