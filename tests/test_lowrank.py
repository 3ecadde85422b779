"""Low-rank factorisation by truncated SVD (lmlab.compress.lowrank).

References: the reconstruction error equals the discarded singular values (Eckart-Young) and
the error of the product the module applies; a full-rank factorisation reproduces the layer;
a factorised model saved in lmlab's format reloads in a new process with the same outputs.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import assert_close_rounding

from lmlab.compress.lowrank import factorise, low_rank, rank_for_energy, summary
from lmlab.models.config import TransformerConfig
from lmlab.models.model import LanguageModel
from lmlab.models.variants import LowRankLinear
from lmlab.utils.errors import LmlabError


def _linear(out_features=48, in_features=32) -> torch.nn.Linear:
    torch.manual_seed(0)
    linear = torch.nn.Linear(in_features, out_features)
    with torch.no_grad():  # a decaying spectrum, as trained weights have
        u, _, vh = torch.linalg.svd(torch.randn(out_features, in_features), full_matrices=False)
        linear.weight.copy_(u @ torch.diag(torch.logspace(0, -2, in_features)) @ vh)
    return linear


@pytest.mark.numerics
def test_truncated_svd_error_equals_the_discarded_singular_values():
    linear = _linear()
    weight = linear.weight.detach().double()
    s = torch.linalg.svdvals(weight)
    for rank in (1, 8, 20):
        module, error, energy = factorise(linear, rank=rank)
        assert isinstance(module, LowRankLinear) and module.rank == rank
        expected = float((s[rank:] ** 2).sum().sqrt() / weight.norm())
        assert error == pytest.approx(expected, rel=1e-9)
        product = module.weight_product().detach().double()
        actual = float((weight - product).norm() / weight.norm())
        # the float32 factors' product rounds each weight within sqrt(rank) eps of its size
        assert_close_rounding(actual, expected, terms=rank, scale=1.0, dtype=torch.float32)
        # float64 sums of 32 squares, from another SVD driver
        assert_close_rounding(energy, float((s[:rank] ** 2).sum() / (s ** 2).sum()), terms=32,
                              scale=1.0, dtype=torch.float64)
        x = torch.randn(5, 32)
        with torch.no_grad():
            assert_close_rounding(module(x), x @ product.float().T + linear.bias,
                                  terms=32, depth=2)


@pytest.mark.numerics
def test_full_rank_reproduces_the_layer():
    linear = _linear()
    module, error, _ = factorise(linear, rank=32)
    x = torch.randn(4, 32)
    with torch.no_grad():
        assert_close_rounding(module(x), linear(x), terms=32, depth=2)
    assert error == 0.0  # nothing discarded: the kept sum is the total, the same sum


def test_energy_picks_the_smallest_sufficient_rank():
    s = torch.tensor([3.0, 2.0, 1.0, 0.5])
    total = float((s ** 2).sum())
    assert rank_for_energy(s, 9 / total) == 1
    assert rank_for_energy(s, 9.01 / total) == 2
    assert rank_for_energy(s, 1.0) == 4
    with pytest.raises(LmlabError, match="energy"):
        rank_for_energy(s, 0.0)


def _model() -> LanguageModel:
    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=101, hidden_size=32, num_hidden_layers=2,
                               num_attention_heads=4, intermediate_size=128,
                               max_position_embeddings=64, hidden_dropout_prob=0.0,
                               attention_probs_dropout_prob=0.0)
    return LanguageModel(config, heads=["mlm"]).eval()


def test_low_rank_model_counts_and_only_factorises_what_saves_weights():
    model = _model()
    before = model.num_parameters()
    rows = low_rank(model, rank=8)
    # 32x32 maps save at rank 8 (8 * 64 < 1024); 32x128 ones too (8 * 160 < 4096)
    assert len(rows) == 2 * 6
    saved = sum(r.parameters_before - r.parameters_after for r in rows)
    assert model.num_parameters() == before - saved
    report = summary(rows, model)
    assert report["matrix_flops_fraction_removed"] == pytest.approx(
        1 - sum(r.parameters_after for r in rows) / sum(r.parameters_before for r in rows))
    whole = _model()
    assert low_rank(whole, rank=20, modules=["q_proj"]) == []  # 20 * 64 > 32 * 32: kept whole
    with pytest.raises(LmlabError, match="exactly one"):
        low_rank(_model(), rank=4, energy=0.9)
    with pytest.raises(LmlabError, match="no linear layer matches"):
        low_rank(_model(), rank=4, modules=["nothing"])


_RELOAD = """
import json, sys, torch
import lmlab
model = lmlab.from_pretrained(sys.argv[1]).eval()
ids = torch.tensor(json.loads(sys.argv[2]))
with torch.no_grad():
    print(json.dumps({"logits": model(input_ids=ids).logits.tolist(),
                      "ranks": model.config.extra["low_rank"]}))
"""


def test_factorised_model_saves_and_reloads_in_a_new_process(tmp_path):
    from lmlab.interop.native import save_model

    model = _model()
    rows = low_rank(model, energy=0.5, modules=["up_proj", "down_proj"])
    assert rows and all(r.energy >= 0.5 for r in rows)
    folder, kind = save_model(model, tmp_path / "low")
    assert kind == "lmlab"  # transformers has no two-matrix linear layer
    ids = torch.randint(5, 101, (2, 7))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    done = subprocess.run([sys.executable, "-c", _RELOAD, str(folder), json.dumps(ids.tolist())],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["ranks"] == {r.name: r.rank for r in rows}
    assert torch.equal(torch.tensor(got["logits"]), expected)  # exact: the same weights and batch


def test_cli_refuses_unknown_modules_before_evaluating(tiny_bert_folder, tmp_path, capsys,
                                                       monkeypatch):
    import lmlab.compress.jobs as command
    import lmlab.compress.magnitude as magnitude
    from lmlab.cli import main

    monkeypatch.setattr(command, "has_head", lambda model, task: True)
    monkeypatch.setattr(magnitude, "task_metric",
                        lambda *args, **kwargs: pytest.fail("evaluated before the check"))
    out = tmp_path / "low"
    assert main(["compress", "low-rank", str(tiny_bert_folder), "--rank", "4", "--modules",
                 "nothing", "--task", "fortunes-topic", "--out", str(out)]) == 2
    assert "no linear layer matches" in capsys.readouterr().err
    assert not out.exists()


_RELOAD_SEQ2SEQ = """
import json, sys, torch
import lmlab
model = lmlab.from_pretrained(sys.argv[1]).eval()
ids, target = (torch.tensor(v) for v in json.loads(sys.argv[2]))
with torch.no_grad():
    print(json.dumps(model(input_ids=ids, decoder_input_ids=target).logits.tolist()))
"""


def test_a_factorised_encoder_decoder_reloads_in_a_new_process(tmp_path):
    """An encoder-decoder's factorised maps ("encoder.layers.i...", "decoder.layers.i...",
    cross-attention included) come back when the saved model is loaded."""
    from lmlab.interop.native import save_model
    from lmlab.models.families import get_family
    from lmlab.models.seq2seq import EncoderDecoderModel

    torch.manual_seed(0)
    config = get_family("bart").config(vocab_size=101, hidden_size=32, num_hidden_layers=2,
                                       num_decoder_layers=2, num_attention_heads=4,
                                       intermediate_size=64, max_position_embeddings=64)
    model = EncoderDecoderModel(config).eval()
    rows = low_rank(model, rank=4, modules=["q_proj", "k_proj", "up_proj"])
    assert any(".cross_attention." in r.name for r in rows)
    folder, _ = save_model(model, tmp_path / "low")
    ids, target = torch.randint(5, 101, (2, 7)), torch.randint(5, 101, (2, 5))
    with torch.no_grad():
        expected = model(input_ids=ids, decoder_input_ids=target).logits
    done = subprocess.run([sys.executable, "-c", _RELOAD_SEQ2SEQ, str(folder),
                           json.dumps([ids.tolist(), target.tolist()])],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert torch.equal(torch.tensor(json.loads(done.stdout.strip().splitlines()[-1])), expected)  # exact: the same weights and batch
