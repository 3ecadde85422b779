"""`lmlab pretrain` of the long-attention families (GPT-Neo with clm, Longformer and BigBird with
mlm) on real KJV shards: the loss falls, the cost report is written, the run's model is the
family's transformers class with its windows (BigBird: its block-sparse pattern)."""

from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    from conftest import unigram_kjv_shards

    return unigram_kjv_shards(tmp_path_factory, "long-corpus")


@pytest.mark.parametrize("family,objective,architecture", [
    ("gpt_neo", "clm", "GPTNeoForCausalLM"), ("longformer", "mlm", "LongformerForMaskedLM"),
    ("big_bird", "mlm", "BigBirdForMaskedLM")])
def test_pretraining_a_windowed_family(shards, tmp_path, family, objective, architecture):
    from conftest import run_lmlab

    out = tmp_path / "run"
    result = run_lmlab("pretrain", "--family", family, "--size", "tiny", "--objective",
                       objective, "--shards", shards, "--out", out, "--seq-len", 128,
                       "--batch-size", 8, "--lr", 3e-3, "--steps", 60, "--log-every", 10,
                       "--eval-every", 60, "--seed", 0, "--threads", 1)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    losses = [r["loss"] for r in rows if r["kind"] == "train"]
    assert losses[-1] < losses[0] - 1.0, losses
    assert (out / "cost.md").is_file()
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["architectures"] == [architecture]
    theirs = getattr(transformers, architecture).from_pretrained(out / "model").config
    if family == "gpt_neo":
        assert theirs.attention_layers == ["global", "local"]
    elif family == "longformer":
        assert theirs.attention_window == [32, 32]
    else:  # 128 tokens in blocks of 16 with one random block: the sparse path (> 7 blocks)
        assert (theirs.attention_type, theirs.block_size) == ("block_sparse", 16)
