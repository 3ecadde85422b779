"""The float tolerance helper of tests/conftest.py: it accepts another summation order, and it
still catches the bugs the parity tests exist for (a missing bias, a wrong mask)."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close_rounding, rounding_tolerance

from lmlab.models.config import TransformerConfig
from lmlab.models.model import LanguageModel

pytestmark = pytest.mark.numerics  # rerun with the kernels held to AVX2 (docs/setup.md)


def test_tolerance_follows_dtype_terms_depth_and_scale():
    base = rounding_tolerance(terms=64, depth=2, scale=1.0)
    assert base == pytest.approx(8 * (2 * 64) ** 0.5 * torch.finfo(torch.float32).eps)
    assert rounding_tolerance(terms=256, depth=2, scale=1.0) == pytest.approx(2 * base)
    assert rounding_tolerance(terms=64, depth=8, scale=1.0) == pytest.approx(2 * base)
    assert rounding_tolerance(terms=64, depth=2, scale=10.0) == pytest.approx(10 * base)
    assert rounding_tolerance(torch.bfloat16, terms=64, depth=2) == pytest.approx(base * 2 ** 16)
    assert base < 1e-4  # far below a bug's size (about the outputs' own size)


def test_other_summation_orders_pass():
    """Sums of 4096 float32 numbers in four orders agree with the float64 sum within the bound."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4096, generator=g) * 30.0  # (rows, terms)
    exact = x.double().sum(-1)
    orders = [x.sum(-1), x.flip(-1).sum(-1), x.view(64, 64, 64).sum(-1).sum(-1),
              x.cumsum(-1)[:, -1]]
    for total in orders:
        assert_close_rounding(total.double(), exact, terms=4096, scale=float(exact.abs().max()),
                              dtype=torch.float32)


def _tiny() -> LanguageModel:
    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2,
                               num_attention_heads=4, intermediate_size=64,
                               max_position_embeddings=64)
    return LanguageModel(config, heads=["mlm"]).eval()


def test_a_missing_bias_is_caught():
    model = _tiny()
    with torch.no_grad():  # a realistic bias: initialisers give small ones, training grows them
        model.transformer.layers[1].feed_forward.up_proj.bias.normal_(0, 0.02)
    ids = torch.randint(5, 97, (2, 10))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        model.transformer.layers[1].feed_forward.up_proj.bias.zero_()
        broken = model(input_ids=ids).logits
    with pytest.raises(AssertionError):
        assert_close_rounding(broken, expected, terms=64, depth=2)


def test_a_wrong_mask_is_caught():
    model = _tiny()
    ids = torch.randint(5, 97, (2, 10))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    real = mask.bool()
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits[real]
        unmasked = model(input_ids=ids).logits[real]  # row 1 sees its padding
    with pytest.raises(AssertionError):
        assert_close_rounding(unmasked, expected, terms=64, depth=2)
