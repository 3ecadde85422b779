"""`lmlab pretrain --init RUN` where RUN is an unfinished recurrent run (checkpoints, no model/):
as for a Transformer run (checked beside them), the latest checkpoint's weights are the start
(they used to be read as a Transformer config and refused with "unknown config fields")."""

from __future__ import annotations

import shutil

import pytest
import torch
from conftest import kjv_shards

import lmlab
from lmlab.cli import main
from lmlab.formats.safetensors_io import load_state
from lmlab.training.pretrain import load_init

OBJECTIVE = {"awd-lstm": "clm", "elmo": "bilm", "bert": "mlm"}  # bert: the Transformer path


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return kjv_shards(tmp_path_factory, 6, 1)


def unfinished_run(family: str, shards, out):
    """A run cut after its step-2 checkpoint: the model/ folder a finished run has removed."""
    lmlab.pretrain(lmlab.PretrainConfig.from_sections(
        None, family=family, size="tiny", objective=OBJECTIVE[family], shards=str(shards),
        out=str(out), max_steps=2, batch_size=2, seq_len=16, save_every=1, eval_every=2,
        eval_batches=1, precision="fp32", progress=False, track_cost=False))
    shutil.rmtree(out / "model")
    return out


@pytest.mark.parametrize("family", ["awd-lstm", "elmo", "bert"])
def test_init_from_an_unfinished_recurrent_run_starts_from_its_latest_checkpoint(
        family, shards, tmp_path, capsys):
    run = unfinished_run(family, shards, tmp_path / "cut")
    model = load_init(run, 30522)  # MiniLM's vocabulary, as the shards
    saved = load_state(run / "checkpoints" / "step-2" / "model.safetensors")
    ours = model.state_dict()
    assert model.config.family == family and list(model.heads) == [OBJECTIVE[family]]
    assert sorted(ours) == sorted(saved)
    for name, tensor in saved.items():
        assert torch.equal(ours[name], tensor), name  # exact: copied
    if family == "awd-lstm":  # the tied decoder is the embedding matrix again
        assert model.heads["clm"].decoder.weight is model.embeddings.weight
    capsys.readouterr()
    code = main(["pretrain", "--init", str(run), "--objective", OBJECTIVE[family], "--shards",
                 str(shards), "--out", str(tmp_path / "next"), "--steps", "1", "--batch-size",
                 "2", "--seq-len", "16", "--eval-batches", "1", "--precision", "fp32",
                 "--no-cost"])
    out = capsys.readouterr().out
    assert code == 0
    assert f"initialised from {run / 'checkpoints' / 'step-2'}" in out
    assert lmlab.from_pretrained(tmp_path / "next").config.family == family


def test_a_recurrent_run_without_a_complete_checkpoint_is_refused(shards, tmp_path, capsys):
    run = tmp_path / "cut"  # killed while writing its first checkpoint: no state.json
    (run / "checkpoints" / "step-1").mkdir(parents=True)
    (run / "config.json").write_text('{"model": {"family": "awd-lstm"}}')
    code = main(["pretrain", "--init", str(run), "--objective", "clm", "--shards", str(shards),
                 "--out", str(tmp_path / "next"), "--steps", "1", "--no-cost"])
    err = capsys.readouterr().err
    assert code == 2 and "has no complete checkpoint" in err and "lmlab: fix:" in err
    assert not (tmp_path / "next" / "model").exists()
