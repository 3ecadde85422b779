"""ALBERT's Figure 1 measures (lmlab/analysis/layer_transitions.py) checked by hand on a tiny
model's hidden states, and scripts/albert_figure1.py end to end at toy size (pretraining a BERT
and an ALBERT for 2 steps each, then ``--models`` on the two saved models)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import save_tiny_bert_folder, tiny_bert

import lmlab
from lmlab.analysis import layer_transitions as T
from lmlab.utils.errors import LmlabError

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "albert_figure1.py"
TEXTS = ["The vase broke.", "Dawn broke over the quiet hills, and nobody saw it.", "He ran"]


def test_sums_by_hand_on_two_layers():
    # one row, two tokens (the second padding); H = 2; input -> layer 0 -> layer 1
    h0 = torch.tensor([[[1.0, 0.0], [5.0, 5.0]]])
    h1 = torch.tensor([[[0.0, 2.0], [9.0, 9.0]]])   # 90 degrees, L2 sqrt(5)
    h2 = torch.tensor([[[0.0, -3.0], [9.0, 9.0]]])  # 180 degrees, L2 5
    l2, cosine, degrees = T.transition_sums([h0, h1, h2], torch.tensor([[1, 0]]))
    # tol: hand-made vectors with exact answers (sqrt 5, 5); float32 norms
    assert l2.tolist() == pytest.approx([math.sqrt(5), 5.0])
    assert cosine.tolist() == pytest.approx([0.0, -1.0], abs=1e-12)
    # tol: hand-made vectors at exactly 90 and 180 degrees; float32 arccos near -1 loses digits
    assert degrees.tolist() == pytest.approx([90.0, 180.0])


@pytest.fixture(scope="module")
def tiny():
    model = tiny_bert(hidden=32, layers=2).eval()
    with torch.no_grad():  # move off the initialisation so the layers do something
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    return model, lmlab.Tokenizer.from_pretrained("minilm")


def test_means_over_the_real_tokens_of_padded_batches_match_a_loop(tiny):
    model, tokenizer = tiny
    got = T.layer_transitions(model, tokenizer, TEXTS, batch_size=2, name="tiny")
    l2, degrees, cosines, count = np.zeros(2), np.zeros(2), np.zeros(2), 0
    for text in TEXTS:  # each text alone, no padding
        ids = tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            states = [h[0].double().numpy() for h in
                      model(**ids, output_hidden_states=True, heads=[]).hidden_states]
        for layer in range(2):
            for a, b in zip(states[layer], states[layer + 1]):
                cos = a @ b / (np.linalg.norm(a) * np.linalg.norm(b))
                l2[layer] += np.linalg.norm(b - a)
                cosines[layer] += cos
                degrees[layer] += math.degrees(math.acos(min(1.0, max(-1.0, cos))))
        count += len(states[0])
    assert got.tokens == count and got.texts == 3 and got.hidden_size == 32
    # tol: float32 means over a padded batch against a per-token loop: sums of tens of terms of O(1)
    assert np.allclose(got.l2, l2 / count, rtol=1e-5)
    # tol: mean cosines in float32 over a padded batch against a per-token loop, values <= 1
    assert np.allclose(got.cosine, cosines / count, atol=1e-6)
    # tol: angles from float32 cosines: arccos near 1 turns 1e-7 into about 1e-3 degrees
    assert np.allclose(got.degrees, degrees / count, atol=1e-3)
    assert "| 0 | " in T.to_markdown([got]) and len(T.to_markdown([got]).splitlines()) == 4


def test_refusals(tiny):
    model, tokenizer = tiny
    with pytest.raises(LmlabError, match="no text"):
        T.layer_transitions(model, tokenizer, ["  "])
    with pytest.raises(LmlabError, match="differ in width"):
        T.check_same_width({"a": 32, "b": 64})


def _script():
    spec = importlib.util.spec_from_file_location("albert_figure1", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_script_pretrains_both_at_toy_size_then_measures_given_models(tmp_path):
    script = _script()
    toy = ["--work", tmp_path / "work", "--sources", "kjv", "--max-documents", "30",
           "--vocab-size", "400", "--hidden", "32", "--layers", "2", "--heads", "2",
           "--embedding-size", "16", "--steps", "2", "--batch-size", "2", "--seq-len", "32",
           "--sample", "12", "--threads", "1"]
    assert script.main([str(a) for a in [*toy, "--out", tmp_path / "fig"]]) == 0  # --threads 1
    saved = json.loads((tmp_path / "fig" / "figure1.json").read_text())
    assert [r["name"] for r in saved["results"]] == ["bert", "albert"]
    assert all(len(r["l2"]) == 2 and r["hidden_size"] == 32 for r in saved["results"])
    assert (tmp_path / "fig" / "figure1.png").stat().st_size > 1000
    models = [saved["models"]["bert"], saved["models"]["albert"]]
    albert = lmlab.from_pretrained(models[1])
    assert albert.config.family == "albert" and albert.config.input_embedding_size == 16
    assert script.main(["--models", *models, "--sample", "12", "--out",
                        str(tmp_path / "given")]) == 0
    again = json.loads((tmp_path / "given" / "figure1.json").read_text())
    for first, second in zip(saved["results"], again["results"]):  # the same models, measured
        assert first["l2"] == second["l2"] and first["degrees"] == second["degrees"]
    # more seeds: seed 0's pretrainings are reused from the cache, seed 1's are new models
    assert script.main([str(a) for a in [*toy, "--seeds", "0,1", "--out", tmp_path / "two"]]) == 0
    two = json.loads((tmp_path / "two" / "figure1.json").read_text())
    assert [r["name"] for r in two["results"]] == ["bert seed 0", "albert seed 0",
                                                   "bert seed 1", "albert seed 1"]
    assert two["models"]["bert seed 0"] == saved["models"]["bert"]
    assert two["models"]["bert seed 1"] != saved["models"]["bert"]
    assert two["results"][2]["l2"] != saved["results"][0]["l2"]
    with pytest.raises(LmlabError, match="--seeds '0,x' is not a list of whole numbers"):
        script.main([str(a) for a in [*toy, "--seeds", "0,x", "--out", tmp_path / "bad"]])


def test_script_refuses_models_of_different_widths(tmp_path):
    narrow = save_tiny_bert_folder(tmp_path / "narrow", hidden=32)
    wide = save_tiny_bert_folder(tmp_path / "wide", hidden=64)
    with pytest.raises(LmlabError, match="differ in width"):
        _script().main(["--models", str(narrow), str(wide), "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()
