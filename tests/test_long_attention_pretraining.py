"""`lmlab pretrain` of the windowed families (GPT-Neo with clm, Longformer with mlm) on real
KJV shards: the loss falls, the cost report is written, the run's model is the family's
transformers class with its windows."""

from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    from conftest import unigram_kjv_shards

    return unigram_kjv_shards(tmp_path_factory, "long-corpus")


@pytest.mark.parametrize("family,objective,architecture", [
    ("gpt_neo", "clm", "GPTNeoForCausalLM"), ("longformer", "mlm", "LongformerForMaskedLM")])
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
    theirs = getattr(transformers, architecture).from_pretrained(out / "model")
    assert (theirs.config.attention_layers if family == "gpt_neo"
            else theirs.config.attention_window) == (["global", "local"] if family == "gpt_neo"
                                                     else [32, 32])
