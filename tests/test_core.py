"""The shared Transformer core: masks, attention paths, cache, rotary, sharing, padding skip."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close_rounding

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


@pytest.mark.numerics
def test_math_path_equals_fused_path():
    model = LanguageModel(tiny(), heads=["mlm"]).eval()
    ids = torch.randint(5, 97, (3, 10))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    with torch.no_grad():
        fused = model(input_ids=ids, attention_mask=mask, skip_padding=False).logits
        math = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    # Another attention kernel, so other summation orders: rounding through 2 layers of sums
    # of up to 64 terms (intermediate size).
    assert_close_rounding(fused, math.logits, terms=64, depth=2)
    probs = math.attentions[0]
    assert probs.shape == (3, 4, 10, 10)
    assert_close_rounding(probs.sum(-1), torch.ones(3, 4, 10), terms=10)  # 10 keys
    assert probs[1, :, :, 7:].abs().max() == 0, "padding keys get no attention"


@pytest.mark.numerics
def test_skip_padding_keeps_real_token_outputs():
    model = LanguageModel(tiny(), heads=["mlm"]).eval()
    ids = torch.randint(5, 97, (3, 12))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    mask[2, 9:] = 0
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=mask, output_hidden_states=True,
                       skip_padding=False)
        skipped = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    real = mask.bool()
    # Fewer rows per matrix product: other kernels' blocking, the same sums up to rounding.
    for a, b in zip(padded.hidden_states, skipped.hidden_states):
        assert_close_rounding(a[real], b[real], terms=64, depth=2)
    assert_close_rounding(padded.logits[real], skipped.logits[real], terms=64, depth=2)
    assert skipped.last_hidden_state[~real].abs().max() == 0


@pytest.mark.numerics
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
        model(input_ids=ids, attention_mask=mask, labels=labels, skip_padding=skip).loss.backward()
        grads.append(model.transformer.layers[0].feed_forward.up_proj.weight.grad.clone())
    # Backward through 2 layers; the weight gradient sums over 16 token rows.
    assert_close_rounding(grads[0], grads[1], terms=64, depth=2)


@pytest.mark.numerics
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
    # One query row at a time against cached keys: other kernels, the same sums.
    assert_close_rounding(torch.cat(steps, dim=1), full, terms=64, depth=2)


def test_causal_model_does_not_see_the_future():
    model = LanguageModel(decoder(), heads=["clm"]).eval()
    ids = torch.randint(0, 97, (1, 8))
    changed = ids.clone()
    changed[0, 6] = (changed[0, 6] + 1) % 97
    with torch.no_grad():
        a, b = model(input_ids=ids).logits, model(input_ids=changed).logits
    assert (a[0, :6] - b[0, :6]).abs().max() == 0
    assert (a[0, 6:] - b[0, 6:]).abs().max() > 0


@pytest.mark.numerics
def test_rotary_is_relative():
    rotary = RotaryEmbedding(8)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(i, j):
        cq, sq = rotary(torch.tensor([[i]]))
        ck, sk = rotary(torch.tensor([[j]]))
        return (apply_rotary(q, cq, sq) * apply_rotary(k, ck, sk)).sum()

    # A dot product of 8 terms; the angles (up to 10 rad) round to 10 * eps, so the scale is
    # 10 * |q| * |k|. A wrong rotation changes the score by about |q| * |k|.
    assert_close_rounding(score(3, 1), score(10, 8), terms=8, scale=10 * float(q.norm() * k.norm()))


@pytest.mark.numerics
def test_sinusoidal_table_values():
    table = sinusoidal_table(4, 6)
    assert table[0, 0] == 0 and table[0, 1] == 1
    assert_close_rounding(table[1, 0], torch.sin(torch.tensor(1.0)))  # vector or scalar sin


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


@pytest.mark.numerics
def test_sparse_prediction_equals_dense_at_masked_positions():
    model = LanguageModel(tiny(), heads=["mlm"]).eval()
    ids = torch.randint(5, 97, (2, 7))
    positions = torch.zeros_like(ids, dtype=torch.bool)
    positions[0, 2] = positions[1, 5] = True
    with torch.no_grad():
        hidden = model(input_ids=ids, heads=[]).last_hidden_state
        dense = model.heads["mlm"](hidden)
        sparse = model.heads["mlm"](hidden, positions=positions)
    # The head on 2 gathered rows or on all 14: other matrix shapes, the same sums of 32 terms.
    assert_close_rounding(dense[positions], sparse, terms=32, depth=2)


# -- padding skipped by default ------------------------------------------------------------------
def _right_padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) (3, 12): one full row, two right-padded rows."""
    ids = torch.randint(5, 97, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    mask[2, 9:] = 0
    return ids, mask


SKIP_CASES = {"encoder": (tiny, ["mlm", "nsp"]), "rotary decoder": (decoder, ["clm"])}


@pytest.mark.numerics
@pytest.mark.parametrize("case", list(SKIP_CASES))
def test_plain_call_skips_padding_and_keeps_outputs(case):
    """``model(**batch)`` takes the fast path by default (zeros at padding positions show it)
    and its real-token outputs equal the padded computation's (``skip_padding=False``) up to
    rounding: every layer's hidden states, the logits and the pooled vector."""
    make, heads = SKIP_CASES[case]
    model = LanguageModel(make(), heads=heads).eval()
    ids, mask = _right_padded_batch()
    real = mask.bool()
    with torch.no_grad():
        fast = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        padded = model(input_ids=ids, attention_mask=mask, output_hidden_states=True,
                       skip_padding=False)
    assert fast.last_hidden_state[~real].abs().max() == 0, "padding was skipped"
    assert padded.last_hidden_state[~real].abs().max() > 0, "padding was computed"
    assert len(fast.hidden_states) == len(padded.hidden_states) == 3
    # fp32 sums of up to 64 terms (intermediate size) through 2 layers, other row blocking
    for a, b in zip(fast.hidden_states, padded.hidden_states):
        assert_close_rounding(a[real], b[real], terms=64, depth=2)
    assert_close_rounding(fast.logits[real], padded.logits[real], terms=64, depth=3)
    if fast.pooler_output is not None:
        assert_close_rounding(fast.pooler_output, padded.pooler_output, terms=64, depth=3)


@pytest.mark.numerics
@pytest.mark.parametrize("case", list(SKIP_CASES))
def test_skip_padding_training_step_has_the_same_gradients(case):
    """A training step (dropout off: with dropout both paths are random draws) gives every
    parameter the same gradient with and without skipping, padding labels ignored (-100)."""
    make, heads = SKIP_CASES[case]
    torch.manual_seed(0)
    model = LanguageModel(make(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
                          heads=heads[:1]).train()
    ids, mask = _right_padded_batch()
    labels = ids.masked_fill(mask == 0, -100)
    grads, losses = [], []
    for skip in (True, False):
        model.zero_grad()
        loss = model(input_ids=ids, attention_mask=mask, labels=labels, skip_padding=skip).loss
        loss.backward()
        losses.append(loss.detach())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert_close_rounding(losses[0], losses[1], terms=64, depth=3, scale=float(losses[1]))
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    # Judged at the size of the largest gradient: some are sums that cancel to ~0 (the key
    # bias cannot change a softmax), whose noise is that of the terms, not of the result.
    scale = max(float(g.abs().max()) for g in grads[1].values())
    for name, grad in grads[1].items():
        assert_close_rounding(grads[0][name], grad, terms=64, depth=4, scale=scale, msg=name)


def test_paths_that_cannot_skip_padding_fall_back():
    """Attention probabilities, a key/value cache, left padding and labels on padding positions
    each need the padding computed: the default call then runs the padded computation itself
    (identical outputs, padding positions not zero)."""
    ids, mask = _right_padded_batch()
    encoder = LanguageModel(tiny(), heads=["mlm"]).eval()
    rotary_decoder = LanguageModel(decoder(), heads=["clm"]).eval()
    cases = {
        "attention probabilities": (encoder, mask, dict(output_attentions=True)),
        "key/value cache": (rotary_decoder, mask, dict(use_cache=True)),
        "left padding": (encoder, mask.flip(1), {}),
        "labels on padding": (encoder, mask, dict(labels=ids)),
    }
    for name, (model, batch_mask, options) in cases.items():
        with torch.no_grad():
            default = model(input_ids=ids, attention_mask=batch_mask, **options)
            padded = model(input_ids=ids, attention_mask=batch_mask, skip_padding=False,
                           **options)
        assert torch.equal(default.last_hidden_state, padded.last_hidden_state), name  # exact: the fallback is the padded path
        assert default.last_hidden_state[batch_mask == 0].abs().max() > 0, name
        if "labels" in options:
            assert torch.equal(default.loss, padded.loss), name  # exact: the fallback is the padded path
