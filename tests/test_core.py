"""The shared Transformer core: masks, attention paths, cache, rotary, sharing, padding skip."""

from __future__ import annotations

import pytest
import torch

from lmlab.models.config import TransformerConfig
from lmlab.models.core.cache import KVCache
from lmlab.models.core.masks import build_attention_mask, causal_mask, document_mask, prefix_lm_mask
from lmlab.models.core.positions import RotaryEmbedding, apply_rotary, sinusoidal_table
from lmlab.models.model import LanguageModel
from lmlab.utils.errors import LmlabError


def tiny(**overrides) -> TransformerConfig:
    values = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=64)
    values.update(overrides)
    return TransformerConfig(**values)


def decoder(**overrides) -> TransformerConfig:
    values = dict(family="llama", causal=True, position_embedding="rotary", norm_type="rmsnorm",
                  pre_norm=True, final_norm=True, embedding_norm=False, type_vocab_size=0,
                  ffn_type="glu", hidden_act="silu", attention_bias=False, mlp_bias=False,
                  num_key_value_heads=2, norm_eps=1e-6, pad_token_id=None)
    values.update(overrides)
    return tiny(**values)


def test_config_parameter_count_matches_model():
    for config in (tiny(), tiny(embedding_size=16, share_layers=True), decoder(),
                   tiny(type_vocab_size=0, position_embedding="sinusoidal")):
        model = LanguageModel(config)
        assert model.num_parameters() == config.num_parameters()


def test_config_errors():
    with pytest.raises(LmlabError, match="not divisible"):
        TransformerConfig(hidden_size=30, num_attention_heads=4)
    with pytest.raises(LmlabError, match="multiple"):
        TransformerConfig(num_attention_heads=12, num_key_value_heads=5)
    with pytest.raises(LmlabError, match="unknown config fields"):
        TransformerConfig.from_dict({"hiden_size": 3})


def test_causal_and_prefix_masks():
    assert causal_mask(3, 3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert causal_mask(1, 4).tolist() == [[True, True, True, True]]
    prefix = prefix_lm_mask(torch.tensor([2]), 4)[0]
    assert prefix[0].tolist() == [True, True, False, False]  # sees the whole prefix
    assert prefix[2].tolist() == [True, True, True, False]  # causal after it
    docs = document_mask(torch.tensor([[0, 0, 1, 1]]))[0]
    assert docs[2].tolist() == [False, False, True, False]


def test_build_mask_fast_paths_and_empty_rows():
    assert build_attention_mask(None, 4, 4, False, torch.device("cpu")) == (None, False)
    assert build_attention_mask(torch.ones(2, 4), 4, 4, True, torch.device("cpu")) == (None, True)
    left_padded = torch.tensor([[0, 0, 1, 1]])
    mask, _ = build_attention_mask(left_padded, 4, 4, True, torch.device("cpu"))
    assert mask[0, 0].any(-1).all(), "a padding query with no visible key must not produce NaN"


def test_math_path_equals_fused_path():
    model = LanguageModel(tiny(), heads=["mlm"]).eval()
    ids = torch.randint(5, 97, (3, 10))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    with torch.no_grad():
        fused = model(input_ids=ids, attention_mask=mask).logits
        math = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    assert (fused - math.logits).abs().max() < 1e-5
    probs = math.attentions[0]
    assert probs.shape == (3, 4, 10, 10)
    assert torch.allclose(probs.sum(-1), torch.ones(3, 4, 10))
    assert probs[1, :, :, 7:].abs().max() == 0, "padding keys get no attention"


def test_skip_padding_keeps_real_token_outputs():
    model = LanguageModel(tiny(), heads=["mlm"]).eval()
    ids = torch.randint(5, 97, (3, 12))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    mask[2, 9:] = 0
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        model.transformer.skip_padding = True
        skipped = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    real = mask.bool()
    for a, b in zip(padded.hidden_states, skipped.hidden_states):
        assert (a[real] - b[real]).abs().max() < 1e-5
    assert (padded.logits[real] - skipped.logits[real]).abs().max() < 1e-5
    assert skipped.last_hidden_state[~real].abs().max() == 0


def test_skip_padding_trains_the_same():
    torch.manual_seed(0)
    model = LanguageModel(tiny(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
                          heads=["mlm"])
    ids = torch.randint(5, 97, (2, 8))
    mask = torch.tensor([[1] * 8, [1] * 5 + [0] * 3])
    labels = torch.where(mask.bool(), ids, torch.tensor(-100))
    grads = []
    for skip in (False, True):
        model.zero_grad()
        model.transformer.skip_padding = skip
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        grads.append(model.transformer.layers[0].feed_forward.up_proj.weight.grad.clone())
    assert (grads[0] - grads[1]).abs().max() < 1e-5


def test_kv_cache_matches_full_sequence():
    model = LanguageModel(decoder(), heads=["clm"]).eval()
    ids = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        full = model(input_ids=ids).logits
        cache = KVCache()
        steps = [model(input_ids=ids[:, :4], past_key_values=cache, use_cache=True).logits]
        for t in range(4, 9):
            steps.append(model(input_ids=ids[:, t:t + 1], past_key_values=cache,
                               use_cache=True).logits)
    assert cache.seq_len() == 9
    assert (torch.cat(steps, dim=1) - full).abs().max() < 1e-5


def test_causal_model_does_not_see_the_future():
    model = LanguageModel(decoder(), heads=["clm"]).eval()
    ids = torch.randint(0, 97, (1, 8))
    changed = ids.clone()
    changed[0, 6] = (changed[0, 6] + 1) % 97
    with torch.no_grad():
        a, b = model(input_ids=ids).logits, model(input_ids=changed).logits
    assert (a[0, :6] - b[0, :6]).abs().max() == 0
    assert (a[0, 6:] - b[0, 6:]).abs().max() > 0


def test_rotary_is_relative():
    rotary = RotaryEmbedding(8)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(i, j):
        cq, sq = rotary(torch.tensor([[i]]))
        ck, sk = rotary(torch.tensor([[j]]))
        return (apply_rotary(q, cq, sq) * apply_rotary(k, ck, sk)).sum()

    assert torch.allclose(score(3, 1), score(10, 8), atol=1e-5)


def test_sinusoidal_table_values():
    table = sinusoidal_table(4, 6)
    assert table[0, 0] == 0 and table[0, 1] == 1
    assert torch.allclose(table[1, 0], torch.sin(torch.tensor(1.0)))


def test_albert_sharing_uses_one_layer():
    model = LanguageModel(tiny(share_layers=True, num_hidden_layers=6, embedding_size=16))
    assert len(model.transformer.layers) == 1
    assert model.transformer.embeddings.projection.weight.shape == (32, 16)
    out = model(input_ids=torch.randint(5, 97, (1, 5)), output_hidden_states=True)
    assert len(out.hidden_states) == 7


def test_tied_embeddings_and_fresh_head():
    model = LanguageModel(tiny(), heads=["mlm"])
    assert model.heads["mlm"].decoder.weight is model.transformer.embeddings.word_embeddings.weight
    model.add_head("nsp")
    assert model.pooler is not None
    out = model(input_ids=torch.randint(5, 97, (2, 5)))
    assert out.head_logits["nsp"].shape == (2, 2)


def test_sparse_prediction_equals_dense_at_masked_positions():
    model = LanguageModel(tiny(), heads=["mlm"]).eval()
    ids = torch.randint(5, 97, (2, 7))
    positions = torch.zeros_like(ids, dtype=torch.bool)
    positions[0, 2] = positions[1, 5] = True
    with torch.no_grad():
        hidden = model(input_ids=ids, heads=[]).last_hidden_state
        dense = model.heads["mlm"](hidden)
        sparse = model.heads["mlm"](hidden, positions=positions)
    assert torch.allclose(dense[positions], sparse, atol=1e-6)
