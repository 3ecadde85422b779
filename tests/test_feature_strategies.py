"""The BERT paper's table 7 strategies in the feature-based recipe, and
scripts/feature_strategies.py end to end on a tiny slice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import assert_close_rounding
from test_finetune_feature_based import assert_same_run, toy_task, train

import lmlab
from lmlab.analysis.features import FeatureExtractor
from lmlab.finetune.feature_based import (
    FeatureHead,
    pooled_layer_states,
    task_features,
    train_feature_based,
)
from lmlab.finetune.recipes import get_recipe
from lmlab.finetune.runner import load_model
from lmlab.finetune.train import RunOptions
from lmlab.models.pooling import STRATEGIES
from lmlab.utils.errors import LmlabError

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "feature_strategies.py"


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_head_input_is_the_strategy_of_the_per_layer_features(name):
    features = torch.randn(5, 7, 8)  # (N, L+1, H)
    head = FeatureHead(7, 8, 3, name).eval()
    expected = STRATEGIES[name](list(features.unbind(1)))
    assert torch.equal(head.combine(features), expected)  # exact: the same strategy function
    assert head.classifier.in_features == (32 if name == "concat_last_four" else 8)
    assert torch.equal(head(features), head.classifier(expected))  # exact: eval: no dropout


def test_pooled_strategy_equals_the_extractors_strategy_sentence_vectors(minilm_dir):
    """Pooling is linear: the head's strategy over mean-pooled layers equals the feature
    extractor's strategy over tokens, then mean-pooled."""
    model = lmlab.from_pretrained(minilm_dir)
    tok = lmlab.Tokenizer.from_pretrained(minilm_dir)
    texts = ["The vase broke.", "Dawn broke over the quiet hills."]
    batch = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        pooled = pooled_layer_states(model, dict(batch), "mean")  # (2, 7, 384)
    for name in STRATEGIES:
        head = FeatureHead(7, 384, 2, name)
        expected = FeatureExtractor(model, tok, layer=name).sentence_vectors(texts, "mean")
        # the same hidden states (one batch), summed over <= 7 layers x 10 tokens in another
        # order: pooled then combined, or combined then pooled
        assert_close_rounding(head.combine(pooled), expected, terms=70, depth=2)


def test_a_strategy_run_saves_and_loads_in_a_new_process(tiny_bert_folder, tmp_path):
    result = train(tiny_bert_folder, tmp_path / "run", layer="concat_last_four")
    assert result["scalar_mix"] is None
    result.save(tmp_path / "model")
    settings = json.loads((tmp_path / "model" / "feature_head.json").read_text())
    assert settings["layer"] == "concat_last_four" and settings["hidden"] == 32
    script = """
import json, sys
import torch
import lmlab

folder, texts = sys.argv[1], json.loads(sys.argv[2])
model = lmlab.from_pretrained(folder)
batch = lmlab.Tokenizer.from_pretrained(folder)(texts, padding=True, return_tensors="pt")
with torch.no_grad():
    logits = model(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
print(model.heads["sequence-classification"].classifier.in_features)
print(json.dumps([model.labels[i] for i in logits.argmax(-1).tolist()]))
"""
    dev = toy_task().split("dev")
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "model"),
                          json.dumps([e.text for e in dev])], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    width, predictions = out.stdout.splitlines()
    assert width == "96"  # three hidden states of 32 (two layers + embeddings), concatenated
    assert json.loads(predictions) == result.predict("dev")


def test_precomputed_features_give_the_same_run(tiny_bert_folder, tmp_path):
    plain = train(tiny_bert_folder, tmp_path / "plain", layer="sum_last_four")
    model, tokenizer, _ = load_model(tiny_bert_folder, False, seed=5)
    recipe = get_recipe("feature", epochs=4, lr=5e-2, batch_size=16, patience=10,
                        layer="sum_last_four")
    features = {split: task_features(toy_task(), split, model, tokenizer, recipe)
                for split in ("train", "dev", "test")}
    reused = train_feature_based(toy_task(), model, tokenizer, recipe, 0, tmp_path / "reused",
                                 RunOptions(progress=False), features=features)
    assert_same_run(plain, reused, tmp_path / "plain", tmp_path / "reused")


def test_unknown_strategy_is_refused_before_the_encoder_runs(tiny_bert_folder, tmp_path):
    with pytest.raises(LmlabError, match="unknown feature strategy 'bogus'"):
        train(tiny_bert_folder, tmp_path / "run", layer="bogus")
    assert not (tmp_path / "run").exists()


def run_script(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, LMLAB_NO_PROGRESS="1", HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


def test_script_runs_end_to_end_on_a_tiny_slice(tmp_path):
    out = tmp_path / "table7.json"
    result = run_script("--task", "fortunes-topic", "--max-train-examples", "24",
                        "--max-eval-examples", "16", "--seeds", "0,1",
                        "--strategies", "embeddings,concat_last_four,scalar_mix",
                        "--runs", str(tmp_path / "runs"), "--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["sizes"] == {"train": 24, "dev": 16, "test": 16} and report["seeds"] == [0, 1]
    assert set(report["summary"]) == {"embeddings", "concat_last_four", "scalar_mix"}
    for strategy, rows in report["rows"].items():
        assert [row["seed"] for row in rows] == [0, 1]
        values = [row["test"]["accuracy"] for row in rows]
        assert report["summary"][strategy]["test"]["values"] == values
        assert (tmp_path / "runs" / "fortunes-topic" / "train-24-eval-16" / strategy / "seed-1"
                / "config.json").is_file()
    assert "| `concat_last_four` |" in result.stdout
    again = run_script("--out", str(out), "--seeds", "0", cwd=tmp_path)
    assert again.returncode == 2 and "already exists" in again.stderr


def test_script_refuses_unknown_strategies_before_work(tmp_path):
    result = run_script("--strategies", "last,bogus", cwd=tmp_path)
    assert result.returncode == 2 and "unknown strategies bogus" in result.stderr
