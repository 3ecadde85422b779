"""Sliding-window attention with global tokens (lmlab/models/core/local_attention.py): the blocked
computation equals dense attention under the equivalent band + global mask, built here on its
own (padded batch, causal and bidirectional, values and gradients); models with a window per
layer; the cache path; config round trip and refusals."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import assert_close_rounding
from test_decoders import randomise
from torch.nn import functional as F

import lmlab
from lmlab.models.config import TransformerConfig
from lmlab.models.core.local_attention import WindowInputs, local_attention
from lmlab.models.model import LanguageModel
from lmlab.utils.errors import LmlabError


def _reference_mask(length: int, window: int, causal: bool, real, glob) -> torch.Tensor:
    """(B, 1, T, T): |key - query| <= window/2 (causal: query - window < key <= query), global
    rows and columns open, padding keys hidden, rows with nothing visible opened."""
    i = torch.arange(length)[:, None]
    j = torch.arange(length)[None, :]
    band = (j <= i) & (j > i - window) if causal else (j - i).abs() <= window // 2
    visible = band | glob[:, None, :] | glob[:, :, None]  # (B, T, T)
    if causal:
        visible &= j <= i
    visible &= real[:, None, :]
    visible |= ~visible.any(-1, keepdim=True)
    return visible[:, None]


def _batch(length: int):
    real = torch.ones(3, length, dtype=torch.bool)
    real[1, length - 7:] = False
    real[2, 5:] = False
    glob = torch.zeros(3, length, dtype=torch.bool)
    glob[0, [0, 17]] = True
    glob[1, 3] = True
    return real, glob


@pytest.mark.parametrize("causal,window", [(False, 2), (False, 6), (False, 10), (True, 1),
                                           (True, 4), (True, 9)])
@pytest.mark.parametrize("with_global", [False, True])
def test_blocked_attention_equals_dense_with_the_band_mask(causal, window, with_global):
    length = 37  # not a multiple of any block
    real, glob = _batch(length)
    if not with_global:
        glob = torch.zeros_like(glob)
    q, k, v = (torch.randn(3, 2, length, 8, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    ours = local_attention(q, k, v, window, causal,
                           WindowInputs(real, glob if with_global else None), scale=0.3)
    theirs = F.scaled_dot_product_attention(
        q, k, v, attn_mask=_reference_mask(length, window, causal, real, glob), scale=0.3)
    read = real[:, None, :, None].expand_as(ours)  # padding queries are never read
    assert_close_rounding(ours[read], theirs[read], terms=length)
    weights = torch.randn_like(ours)
    ours_grad = torch.autograd.grad((ours * weights)[read].sum(), (q, k, v))
    theirs_grad = torch.autograd.grad((theirs * weights)[read].sum(), (q, k, v))
    for a, b in zip(ours_grad, theirs_grad):  # q's is 0 where one key is seen: size 1
        assert_close_rounding(a, b, terms=length, scale=max(1.0, float(b.abs().max())))


def _config(causal: bool, window, **overrides) -> TransformerConfig:
    return TransformerConfig(
        family="gpt2" if causal else "bert", vocab_size=97, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
        causal=causal, pre_norm=causal, attention_window=window, **overrides)


def _model(config: TransformerConfig) -> LanguageModel:
    torch.manual_seed(0)
    return randomise(LanguageModel(config, heads=["clm" if config.causal else "mlm"]))


@pytest.mark.parametrize("causal", [False, True])
def test_windowed_model_equals_dense_model_under_the_band_mask(causal):
    length, window = 40, 6
    real, glob = _batch(length)
    if causal:
        glob = torch.zeros_like(glob)
    ids = torch.randint(1, 97, (3, length))
    windowed, dense = _model(_config(causal, window)), _model(_config(causal, None))
    dense.load_state_dict(windowed.state_dict())
    with torch.no_grad():
        ours = windowed(ids, attention_mask=real.long(), global_attention_mask=glob.long()).logits
        theirs = dense(ids, attention_mask=_reference_mask(length, window, causal, real, glob)
                       [:, 0].long()).logits
    assert_close_rounding(ours[real], theirs[real], terms=length, depth=2)


@pytest.mark.parametrize("causal", [False, True])
def test_per_layer_windows_blocked_equal_their_dense_fallback(causal):
    """Local and dense layers alternating (GPT-3's pattern): the blocked path equals the dense
    band-masked path the same model takes when probabilities are asked for; gradients too."""
    length = 33
    real, glob = _batch(length)
    model = _model(_config(causal, [4, 0]))
    ids = torch.randint(1, 97, (3, length))
    kwargs = dict(attention_mask=real.long(), global_attention_mask=glob.long())
    blocked = model(ids, **kwargs).logits
    dense = model(ids, output_attentions=True, **kwargs)
    assert_close_rounding(blocked[real], dense.logits[real], terms=length, depth=2)
    probs = dense.attentions[0][0, 0]  # layer 0 (window 4), row 0, head 0: (T, T)
    i, j = torch.arange(length)[:, None], torch.arange(length)[None, :]
    band = ((j <= i) & (j > i - 4)) if causal else ((j >= i - 2) & (j <= i + 2))  # window 4
    seen = band | glob[0][None, :] | glob[0][:, None]
    assert bool((probs[~(seen & ((j <= i) if causal else True))] == 0).all())
    grads = [torch.autograd.grad(out[real].square().sum(), model.transformer.layers[0]
                                 .attention.q_proj.weight)[0]
             for out in (model(ids, **kwargs).logits,
                         model(ids, output_attentions=True, **kwargs).logits)]
    assert_close_rounding(grads[0], grads[1], terms=length, depth=2)


def test_cached_generation_equals_the_full_forward():
    model = _model(_config(True, [3, 0]))
    ids = torch.randint(1, 97, (2, 12))
    with torch.no_grad():
        full = model(ids).logits
        out = model(ids[:, :7], use_cache=True)
        steps = [out.logits]
        for t in range(7, 12):
            out = model(ids[:, t:t + 1], past_key_values=out.past_key_values, use_cache=True)
            steps.append(out.logits)
    assert_close_rounding(torch.cat(steps, 1), full, terms=12, depth=2)


_RELOAD = """
import json, sys, torch, lmlab
model = lmlab.from_pretrained(sys.argv[1])
ids, glob = (torch.tensor(v) for v in json.loads(sys.argv[2]))
print(json.dumps([model.config.attention_window,
                  model(ids, global_attention_mask=glob).logits.tolist()]))
"""


def test_config_round_trips_and_the_model_reloads_in_a_fresh_process(tmp_path):
    config = _config(False, [4, 8])
    assert TransformerConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    model = _model(config)
    folder = lmlab.save_pretrained(model, tmp_path / "windowed")
    ids = torch.randint(1, 97, (2, 20))
    glob = torch.zeros(2, 20, dtype=torch.long)
    glob[:, 0] = 1
    with torch.no_grad():
        expected = model(ids, global_attention_mask=glob).logits
    result = subprocess.run([sys.executable, "-c", _RELOAD, str(folder),
                             json.dumps([ids.tolist(), glob.tolist()])],
                            capture_output=True, text=True, check=True)
    window, logits = json.loads(result.stdout.strip().splitlines()[-1])
    assert window == [4, 8]
    assert torch.equal(torch.tensor(logits), expected)  # exact: same weights, inputs and ops


@pytest.mark.parametrize("window,overrides,says", [
    (-2, {}, "whole number"), (2.5, {}, "whole number"), (True, {}, "whole number"),
    (5, {}, "odd"), ([4], {}, "1 entries for 2 layers"),
    (4, dict(position_embedding="relative"), "not supported"),
    ([4, 8], dict(share_layers=True), "not supported"),
])
def test_bad_windows_are_refused(window, overrides, says):
    with pytest.raises(LmlabError, match=says):
        _config(False, window, **overrides)


def test_global_tokens_without_a_window_are_refused():
    model = _model(_config(False, None))
    with pytest.raises(LmlabError, match="without an attention window"):
        model(torch.ones(1, 4, dtype=torch.long), global_attention_mask=torch.ones(1, 4))
