"""GPT-Neo (family gpt_neo): GPT-3's alternating dense and locally banded layers as lmlab's
per-layer ``attention_window``; parity both ways with transformers' GPTNeoForCausalLM (random
weights, a padded batch longer than the window), the cache, presets, refusals."""

from __future__ import annotations

import pytest
import torch
from test_decoders import assert_same_outputs, randomise

import lmlab
from lmlab.models.model import LanguageModel
from lmlab.models.presets import family_config, preset
from lmlab.utils.errors import LmlabError

transformers = pytest.importorskip("transformers")


def _config(**overrides):
    values = dict(vocab_size=97, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=64,
                  attention_window=[0, 4, 0, 4])
    return family_config("gpt_neo", **{**values, **overrides})


def _inputs():
    ids = torch.randint(1, 97, (2, 20), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, 13:] = 0  # right padding
    return ids, mask


@pytest.mark.numerics
@pytest.mark.parametrize("heads", [(), ("clm",)])
def test_save_matches_transformers(tmp_path, heads):
    ours = randomise(LanguageModel(_config(), heads=heads))
    lmlab.save_pretrained(ours, tmp_path)
    auto = transformers.AutoModelForCausalLM if heads else transformers.AutoModel
    theirs = auto.from_pretrained(tmp_path).eval()
    assert theirs.config.attention_layers == ["global", "local"] * 2
    assert theirs.config.window_size == 4
    ids, mask = _inputs()
    with torch.no_grad():
        a = ours(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        b = theirs(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    keep = mask.bool()
    for x, y in zip(a.hidden_states, b.hidden_states, strict=True):
        assert_same_outputs(x[keep], y[keep])
    if heads:
        assert_same_outputs(a.logits[keep], b.logits[keep])


@pytest.mark.numerics
def test_load_from_transformers_and_the_cache(tmp_path):
    hf_config = transformers.GPTNeoConfig(
        vocab_size=97, hidden_size=32, num_layers=3, num_heads=4, max_position_embeddings=64,
        attention_types=[[["local", "global", "local"], 1]], window_size=5)
    theirs = randomise(transformers.GPTNeoForCausalLM(hf_config))
    theirs.save_pretrained(tmp_path)
    ours = lmlab.from_pretrained(tmp_path)
    assert ours.config.family == "gpt_neo" and ours.config.attention_window == [5, 0, 5]
    assert ours.config.intermediate_size == 128
    assert sum(p.numel() for p in ours.parameters()) == theirs.num_parameters() \
        == ours.config.num_parameters()
    ids, mask = _inputs()
    with torch.no_grad():
        a = ours(input_ids=ids, attention_mask=mask).logits
        b = theirs(input_ids=ids, attention_mask=mask).logits
        assert_same_outputs(a[mask.bool()], b[mask.bool()])
        out = ours(input_ids=ids[:1, :6], use_cache=True)
        steps = [out.logits]
        for t in range(6, 20):  # past the window: the cached keys leave the band
            out = ours(input_ids=ids[:1, t:t + 1], past_key_values=out.past_key_values,
                       use_cache=True)
            steps.append(out.logits)
    assert_same_outputs(torch.cat(steps, 1), b[:1])


def test_presets_match_transformers_shapes():
    config = preset("gpt_neo", "125m")
    hf = transformers.GPTNeoConfig(hidden_size=768, num_layers=12, num_heads=12,
                                   attention_types=[[["global", "local"], 6]])
    with torch.device("meta"):
        theirs = transformers.GPTNeoForCausalLM(hf)
    assert config.num_parameters() == theirs.num_parameters()
    assert config.attention_window == [0, 256] * 6


def test_two_local_windows_are_not_saved_as_gpt_neo(tmp_path, capsys):
    model = LanguageModel(_config(attention_window=[0, 4, 0, 8]), heads=("clm",))
    lmlab.save_pretrained(model, tmp_path)  # GPT-Neo has one window_size: lmlab's own format
    assert "one local window" in capsys.readouterr().out
    assert lmlab.from_pretrained(tmp_path).config.attention_window == [0, 4, 0, 8]
    with pytest.raises(LmlabError, match="attention types"):
        lmlab.models.families.get_family("gpt_neo").config_from_hf(
            dict(hidden_size=32, num_layers=1, num_heads=4, attention_types=[[["sparse"], 1]]))
