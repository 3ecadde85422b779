"""Checkpoint files: tied weights, atomic commit, keep-last, RNG round trip."""

from __future__ import annotations

import random

import numpy as np
import torch
from test_trainer import tiny_model

from lmlab.formats.safetensors_io import split_tied
from lmlab.training import checkpoint as ckpt


def test_tied_weights_saved_once_and_retied(tmp_path):
    model = tiny_model()
    tied = model.heads["mlm"].decoder.weight
    assert tied is model.transformer.embeddings.word_embeddings.weight
    unique, aliases = split_tied(model.state_dict())
    assert aliases == {"heads.mlm.decoder.weight": "transformer.embeddings.word_embeddings.weight"}
    ckpt.save_module(model, tmp_path / "m.safetensors")
    other = tiny_model(seed=1)
    ckpt.load_module(other, tmp_path / "m.safetensors")
    assert other.heads["mlm"].decoder.weight is other.transformer.embeddings.word_embeddings.weight
    for (name, a), (_, b) in zip(model.state_dict().items(), other.state_dict().items()):
        assert torch.equal(a, b), name  # exact: saved and loaded


def test_commit_is_atomic_and_keeps_last(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        tmp = ckpt.staging_dir(root, step)
        (tmp / "state.json").write_text("{}")
        assert not (root / f"step-{step}").exists()  # invisible until committed
        ckpt.commit(tmp, keep_last=2)
    assert [s for s, _ in ckpt.list_checkpoints(root)] == [2, 3]
    # a staging folder left by a kill is ignored, then cleaned by the next save
    crashed = root / "step-4.tmp"
    crashed.mkdir()
    (crashed / "state.json").write_text("{}")
    assert ckpt.latest_checkpoint(root) == root / "step-3"
    ckpt.staging_dir(root, 5)
    assert not crashed.exists()


def test_rng_round_trip(tmp_path):
    json_state, tensors = ckpt.rng_state()
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    ckpt.set_rng_state(json_state, tensors)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected
    torch.save(tensors, tmp_path / "rng.pt")
    loaded = torch.load(tmp_path / "rng.pt", weights_only=True)
    assert torch.equal(loaded["cpu"], tensors["cpu"])
