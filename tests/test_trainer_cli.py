"""`lmlab pretrain` and `lmlab runs show` end to end on real token shards (KJV, MiniLM's
tokenizer), with the real objectives and data stream."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import kjv_shards

from lmlab.cli import main
from lmlab.training.metrics_log import read_metrics


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """Shards of 24 + 6 KJV chapters."""
    return kjv_shards(tmp_path_factory, train=24, validation=6)


def test_pretrain_cli_runs_resumes_and_reports(shards, tmp_path, capsys):
    out = tmp_path / "runs" / "tiny"
    args = ["pretrain", "--family", "bert", "--size", "tiny", "--objective", "mlm,sop",
            "--shards", str(shards), "--seq-len", "64", "--batch-size", "4", "--lr", "1e-3",
            "--warmup", "2", "--steps", "4", "--save-every", "2", "--eval-every", "2",
            "--eval-batches", "2", "--log-every", "1", "--out", str(out), "--no-cost"]
    assert main(args) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["hparams"]["objective"] == "mlm,sop" and config["hparams"]["max_steps"] == 4
    assert config["speed"]["precision"] == "fp32" and config["model"]["hidden_size"] == 128
    assert set(config["objective"]["heads"]) == {"mlm", "sop"}
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3, 4]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [2, 4]
    assert (out / "tokenizer" / "tokenizer.json").is_file()
    assert (out / "model" / "tokenizer.json").is_file()  # the final model is self-contained
    import lmlab

    model = lmlab.from_pretrained(out / "model")
    assert model.config.num_hidden_layers == 2
    # extending the run: same command with more steps resumes from step 4
    longer = list(args)
    longer[longer.index("--steps") + 1] = "6"
    assert main(longer) == 0
    assert "resuming from" in capsys.readouterr().out
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")
            if r["kind"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert main(["runs", "show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "Run report" in shown and "eval_loss" in shown and "steps: 6" in shown


def test_pretrain_from_minilm_adds_fresh_mlm_head(shards, tmp_path, capsys, minilm_dir):
    out = tmp_path / "dapt"
    assert main(["pretrain", "--init", str(minilm_dir), "--objective", "mlm", "--shards",
                 str(shards), "--seq-len", "32", "--batch-size", "2", "--steps", "1",
                 "--eval-batches", "1", "--out", str(out), "--no-cost"]) == 0
    printed = capsys.readouterr().out
    assert "has no mlm head" in printed and "initialised from" in printed
    assert (out / "model" / "config.json").is_file()


def test_pretrain_config_file_sections(shards, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        "hparams:\n  family: bert\n  size: tiny\n  objective: mlm\n"
        f"  shards: {shards}\n  seq_len: 32\n  batch_size: 2\n  max_steps: 1\n"
        "speed:\n  precision: bf16\n  threads: 1\n")
    out = tmp_path / "from_yaml"
    assert main(["pretrain", "--config", str(config), "--out", str(out), "--no-cost"]) == 0
    saved = json.loads((out / "config.json").read_text())
    assert saved["speed"]["precision"] == "bf16" and saved["hparams"]["seq_len"] == 32
    bad = tmp_path / "bad.yaml"
    bad.write_text("hparams:\n  max_steps: 1\n  precision: bf16\n")
    assert main(["pretrain", "--config", str(bad), "--out", str(tmp_path / "x")]) == 2


def test_pretrain_tokenizer_accepts_a_short_name(shards):
    """--tokenizer minilm finds the catalogued MiniLM the shards were written with."""
    from lmlab import PretrainConfig
    from lmlab.training.pretrain import find_tokenizer
    from lmlab.utils.catalog import minilm_dir

    PretrainConfig.from_sections(out="r", shards=str(shards), family="bert", size="tiny",
                                 seq_len=32, max_steps=1, tokenizer="minilm").validate()
    tokenizer, folder = find_tokenizer(shards, "minilm")
    assert folder == minilm_dir() and len(tokenizer) == 30522
