"""word2vec and GloVe with a run folder (lmlab.training.loop_run): exact resume after SIGKILL,
a time budget that ends the run (and fits word2vec's learning-rate decay to it), a cost report,
and resumption refused with other settings or another corpus, nothing written.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import FakeClock, assert_clean_refusal, disk_snapshot, run_lmlab, run_lmlab_here

from lmlab.training.loop_run import LoopRun
from lmlab.training.run_dir import list_checkpoints
from lmlab.vectors import glove, word2vec
from lmlab.vectors.loop import loop_hparams

WORDS = [f"w{i}" for i in range(60)]


def corpus(sentences: int = 300, seed: int = 0) -> list[list[str]]:
    """Sentences of a Zipf-like vocabulary: enough words for several chunks and minibatches."""
    rng = random.Random(seed)
    return [[WORDS[min(int(rng.expovariate(0.08)), len(WORDS) - 1)]
             for _ in range(rng.randint(4, 14))] for _ in range(sentences)]


# small jobs: many steps, so a kill falls between two of them
CONFIGS = {"skipgram": word2vec.Word2VecConfig(dim=8, epochs=3, min_count=2, chunk_words=150),
           "glove": glove.GloveConfig(dim=8, epochs=4, min_count=2, chunk_entries=64)}

SCRIPT = """
import json, sys, time
sys.path.insert(0, {tests!r})
from test_vectors_run import CONFIGS, corpus
from safetensors.numpy import save_file
from lmlab.training.loop_run import LoopRun
from lmlab.training.run_dir import list_checkpoints
from lmlab.utils.errors import LmlabError
from lmlab.vectors import glove, word2vec
from lmlab.vectors.loop import loop_hparams

method, out, delay = sys.argv[1], sys.argv[2], float(sys.argv[3])
budget = float(sys.argv[4]) if len(sys.argv) > 4 else None
if method == "glove":  # a slow step, so that the kill falls mid-run
    step = glove.GloveModel.train
    glove.GloveModel.train = lambda self, *a: (time.sleep(delay), step(self, *a))[1]
else:
    chunk = word2vec._train_chunk
    word2vec._train_chunk = lambda *a: (time.sleep(delay), chunk(*a))[1]
config = CONFIGS[method]
try:
    run = LoopRun(out, loop_hparams(config), budget_seconds=budget, checkpoint_seconds=0)
    train = glove.train_glove if method == "glove" else word2vec.train_word2vec
    vectors, summary = train(corpus(), config, show_progress=False, run=run)
except LmlabError as error:
    print(error.problem, file=sys.stderr)
    sys.exit(2)
save_file({{"matrix": vectors.matrix}}, out + "/vectors.safetensors")
with open(out + "/summary.json", "w") as handle:
    json.dump({{"epoch_loss": summary.epoch_loss, "stop_reason": summary.stop_reason}}, handle)
"""


def _launch(script: Path, method: str, out: Path, delay: float, *budget: str
            ) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", LMLAB_NO_PROGRESS="1")
    return subprocess.Popen([sys.executable, str(script), method, str(out), str(delay), *budget],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(process: subprocess.Popen) -> str:
    out, _ = process.communicate(timeout=300)
    assert process.returncode == 0, out
    return out


def _steps(out: Path) -> list[int]:
    return [step for step, _ in list_checkpoints(out / "checkpoints")]


def _result(out: Path) -> tuple[torch.Tensor, dict]:
    from safetensors.torch import load_file

    return (load_file(out / "vectors.safetensors")["matrix"],
            json.loads((out / "summary.json").read_text()))


@pytest.mark.parametrize("method", ["skipgram", "glove"])
def test_sigkill_and_resume_give_the_uninterrupted_vectors(tmp_path, method):
    """Killed with SIGKILL after a few checkpoints and run again, the loop ends with the
    vectors and epoch losses of an uninterrupted run, bit for bit. Resuming with a time budget
    added is refused for word2vec (its learning rate would decay over another horizon) and
    allowed for GloVe (its learning rate is constant: the budget only ends the run)."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(tests=str(Path(__file__).resolve().parent)))
    reference = _launch(script, method, tmp_path / "whole", 0.0)
    killed = tmp_path / "killed"
    victim = _launch(script, method, killed, 0.2)
    deadline = time.time() + 240
    while max(_steps(killed), default=0) < 3:
        assert victim.poll() is None, victim.communicate()[0]
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.02)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    newest = list_checkpoints(killed / "checkpoints")[-1][1]
    assert "stop_reason" not in json.loads((newest / "state.json").read_text())  # mid-run
    _finish(reference)

    before = disk_snapshot(killed)
    budgeted = _launch(script, method, killed, 0.0, "3600")
    if method == "skipgram":
        out, _ = budgeted.communicate(timeout=300)
        assert budgeted.returncode == 2 and "budget_seconds: None -> 3600.0" in out, out
        assert disk_snapshot(killed) == before
        budgeted = _launch(script, method, killed, 0.0)
    assert "resuming from" in _finish(budgeted)

    whole_vectors, whole = _result(tmp_path / "whole")
    resumed_vectors, resumed = _result(killed)
    assert torch.equal(resumed_vectors, whole_vectors)  # exact: the same steps on the same state
    assert resumed == whole and len(whole["epoch_loss"]) == CONFIGS[method].epochs
    assert (killed / "cost.md").is_file() and (killed / "cost.json").is_file()


def test_a_budget_ends_word2vec_with_its_learning_rate_decayed(tmp_path, monkeypatch):
    """A clock that moves one second per chunk: a 10 s budget ends the run after 10 chunks
    of the many its epochs plan, the learning rate decayed to near ``min_alpha`` as it ends
    (the horizon extrapolated from the rate so far); a larger budget then extends it."""
    clock = FakeClock()
    monkeypatch.setattr("lmlab.training.loop_run.time", clock)
    chunk, loop = word2vec._train_chunk, word2vec.compiled.word2vec_chunk
    rates: list[float] = []  # each job's learning rate at its first word

    def timed_chunk(*args):
        clock.now += 1.0
        return chunk(*args)

    def recorded_loop(*args):
        rates.append(args[11])  # alpha_from
        return loop(*args)

    monkeypatch.setattr(word2vec, "_train_chunk", timed_chunk)
    monkeypatch.setattr(word2vec.compiled, "word2vec_chunk", recorded_loop)
    config = word2vec.Word2VecConfig(dim=8, epochs=5, min_count=2, chunk_words=100)
    sentences = corpus()

    def train(budget: float):
        run = LoopRun(tmp_path / "run", loop_hparams(config), budget_seconds=budget)
        return word2vec.train_word2vec(sentences, config, show_progress=False, run=run)[1]

    summary = train(10.0)
    assert summary.stop_reason == "budget" and summary.cost["tokens"] == summary.trained_words
    assert summary.trained_words < config.epochs * summary.corpus_words / 2
    assert rates[0] == config.alpha and rates[-1] < 0.12 * config.alpha
    state = json.loads(next((tmp_path / "run" / "checkpoints").glob("step-10")).joinpath(
        "state.json").read_text())
    assert state["stop_reason"] == "budget" and state["elapsed"] == 10.0

    rates.clear()
    longer = train(20.0)  # the run had ended: its budget may grow
    assert longer.stop_reason == "budget" and longer.trained_words > summary.trained_words
    assert rates and max(rates) < config.alpha  # continued, not started over


# -- the command ---------------------------------------------------------------------------------
def _write_corpus(path: Path, seed: int = 0) -> Path:
    path.write_text("\n".join(" ".join(s) for s in corpus(seed=seed)) + "\n")
    return path


def test_cli_run_folder_resumes_and_refuses_other_settings(tmp_path):
    text = _write_corpus(tmp_path / "corpus.txt")
    other_text = _write_corpus(tmp_path / "other.txt", seed=1)
    run, out = tmp_path / "run", tmp_path / "v.txt"
    args = ["vectors", "train", "--method", "cbow", "--corpus", text, "--out", out, "--dim", 8,
            "--min-count", 2, "--epochs", 2, "--run", run]
    result = run_lmlab(*args)
    assert result.returncode == 0, result.stderr
    assert f"({run}/cost.md)" in result.stdout
    config = json.loads((run / "config.json").read_text())
    assert config["hparams"]["architecture"] == "cbow" and config["data"]["corpus_fingerprint"]
    cost = json.loads((run / "cost.json").read_text())
    assert cost["model"] == "word2vec cbow" and cost["flops"] > 0
    written = out.read_bytes()

    # the same command again: the finished run is resumed, its vectors written again
    result = run_lmlab(*args)
    assert result.returncode == 0, result.stderr
    assert "resuming from" in result.stdout and out.read_bytes() == written

    before = disk_snapshot(tmp_path)
    for changed, problem in (
            (["--dim", 9], "dim: 8 -> 9"),
            (["--corpus", other_text], "corpus_fingerprint"),  # refused after counting
            (["--method", "glove"], "method: 'word2vec' -> 'glove'")):
        flags = list(map(str, args))
        flags[flags.index(changed[0]) + 1] = str(changed[1])
        assert_clean_refusal(run_lmlab_here(*flags), str(run), problem, fix="--run folder")
        assert disk_snapshot(tmp_path) == before, changed
    elsewhere = [*args[:args.index("--out") + 1], tmp_path / "new.txt",
                 *args[args.index("--out") + 2:-1], tmp_path]  # --run: a folder of other files
    assert_clean_refusal(run_lmlab_here(*elsewhere), "already holds", fix="--run")
    assert disk_snapshot(tmp_path) == before
