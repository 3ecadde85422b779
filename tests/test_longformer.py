"""Longformer (family longformer): RoBERTa in sliding windows with global tokens mapped by their
own q, k, v; parity both ways with transformers' LongformerModel / LongformerForMaskedLM (random
weights, a padded batch longer than the windows, global tokens; values and the dense fallback),
fresh-process reload, presets, refusals."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from test_decoders import assert_same_outputs, randomise

import lmlab
from lmlab.models.model import LanguageModel
from lmlab.models.presets import family_config, preset

transformers = pytest.importorskip("transformers")


def _config(**overrides):
    values = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=64, attention_window=[4, 6])
    return family_config("longformer", **{**values, **overrides})


def _inputs():
    ids = torch.randint(3, 97, (2, 21), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, 15:] = 0
    ids[1, 15:] = 1  # pad_token_id: RoBERTa numbers positions after it
    glob = torch.zeros_like(ids)
    glob[:, 0] = 1
    glob[0, 9] = 1  # rows with different global counts
    return dict(input_ids=ids, attention_mask=mask, global_attention_mask=glob)


@pytest.mark.numerics
@pytest.mark.parametrize("heads", [(), ("mlm",)])
def test_save_matches_transformers(tmp_path, heads):
    ours = randomise(LanguageModel(_config(), heads=heads, with_pooler=not heads))
    lmlab.save_pretrained(ours, tmp_path)
    auto = transformers.AutoModelForMaskedLM if heads else transformers.AutoModel
    theirs = auto.from_pretrained(tmp_path).eval()
    batch = _inputs()
    keep = batch["attention_mask"].bool()
    with torch.no_grad():
        expected = theirs(**batch, output_hidden_states=True)
        for probs in (False, True):  # blocked, and the dense fallback that returns probabilities
            got = ours(**batch, output_hidden_states=True, output_attentions=probs)
            for x, y in zip(got.hidden_states, expected.hidden_states[:3], strict=True):
                assert_same_outputs(x[keep], y[:, :21][keep])
            if heads:
                assert_same_outputs(got.logits[keep], expected.logits[keep])
            else:
                assert_same_outputs(got.pooler_output, expected.pooler_output)


_RELOAD = """
import json, sys, torch, lmlab
model = lmlab.from_pretrained(sys.argv[1])
batch = {k: torch.tensor(v) for k, v in json.loads(sys.argv[2]).items()}
with torch.no_grad():
    print(json.dumps(model(**batch).logits.tolist()))
"""


@pytest.mark.numerics
def test_load_from_transformers_in_a_fresh_process(tmp_path):
    hf_config = transformers.LongformerConfig(
        vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=48, max_position_embeddings=64, attention_window=8, pad_token_id=1)
    theirs = randomise(transformers.LongformerForMaskedLM(hf_config))
    theirs.save_pretrained(tmp_path)
    batch = _inputs()
    with torch.no_grad():
        expected = theirs(**batch).logits
    result = subprocess.run([sys.executable, "-c", _RELOAD, str(tmp_path),
                             json.dumps({k: v.tolist() for k, v in batch.items()})],
                            capture_output=True, text=True, check=True)
    logits = torch.tensor(json.loads(result.stdout.strip().splitlines()[-1]))
    keep = batch["attention_mask"].bool()
    assert_same_outputs(logits[keep], expected[keep])
    ours = lmlab.from_pretrained(tmp_path)
    assert ours.config.attention_window == [8, 8] and ours.config.family == "longformer"
    assert sum(p.numel() for p in ours.transformer.parameters()) == ours.config.num_parameters()


def test_presets_match_transformers_counts():
    config = preset("longformer", "base")
    with torch.device("meta"):
        theirs = transformers.LongformerModel(transformers.LongformerConfig(
            vocab_size=50265, max_position_embeddings=4098, type_vocab_size=1, pad_token_id=1),
            add_pooling_layer=False)  # lmlab counts the bare stack
    assert config.num_parameters() == theirs.num_parameters()


def test_a_dense_layer_is_not_saved_as_longformer(tmp_path, capsys):
    model = LanguageModel(_config(attention_window=[4, 0]), heads=("mlm",))
    lmlab.save_pretrained(model, tmp_path)  # Longformer windows every layer: lmlab's format
    assert "windows every layer" in capsys.readouterr().out
    assert lmlab.from_pretrained(tmp_path).config.attention_window == [4, 0]
