"""The recurrent models' cost: parameter counts from the shapes against the built models, FLOPs
per token against torch's FlopCounterMode, `lmlab cost estimate / flops` for AWD-LSTM and ELMo,
and the cost report of a recurrent pretraining run.

FLOPs: both sides count matrix products and convolutions only (2 FLOPs per multiply-add); the
LSTM's gate nonlinearities, the cell update, dropout, max-pooling and the loss are elementwise and
left out by both. A forward pass therefore agrees exactly. A training pass is 3 x forward minus
one product per LSTM run that autograd skips: the gradient of the initial state, a constant zero
(``W_hh^T @ dgates`` at step 0), ``2·4h·r`` FLOPs per sequence (r the recurrent input's width).
The counts are integers well inside float64's exact range, so the tolerance is float rounding.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import kjv_shards

from lmlab.cli import main
from lmlab.cost.flop_counter import measure_flops
from lmlab.cost.presets import default_head, preset_config
from lmlab.interop.recurrent import build_model
from lmlab.models.rnn.config import SIZES, recurrent_preset
from lmlab.utils.errors import LmlabError

B, T, V = 2, 7, 50
LM_HEAD = {"awd-lstm": "clm", "elmo": "bilm"}

CASES = {
    "awd-lstm tiny": ("awd-lstm", {}),
    "awd-lstm untied, narrow last layer": ("awd-lstm", {"tie_word_embeddings": False,
                                                        "output_size": 24}),
    "elmo tiny": ("elmo", {}),
    "elmo 3 layers, 1 highway": ("elmo", {"num_layers": 3, "num_highway": 1}),
}


def config_of(case: str):
    family, overrides = CASES[case]
    return recurrent_preset(family, "tiny", vocab_size=V, **overrides)


def skipped_initial_state_gradient(config) -> int:
    """FLOPs per sequence that autograd does not spend: the step-0 gradient of the zero initial
    state of every LSTM run (one per AWD-LSTM layer, two per ELMo layer)."""
    if config.family == "elmo":
        return 2 * config.num_layers * 2 * 4 * config.lstm_size * config.projection_size
    return sum(2 * 4 * h * h for _, h in config.layer_sizes())


@pytest.mark.parametrize("family", list(SIZES))
def test_every_preset_counts_the_parameters_of_the_built_model(family):
    """Built on the meta device (shapes, no memory), so the paper sizes are checked too."""
    for size in SIZES[family]:
        config = recurrent_preset(family, size)
        with torch.device("meta"):
            model = build_model(config, [LM_HEAD[family]])
        built = sum(p.numel() for p in model.parameters())  # tied matrices once
        # the vocabulary-sized tensors: the softmax, and AWD-LSTM's embedding table (the tied
        # decoder weight is that table: one tensor, counted once)
        vocab_sized = {id(p): p for p in model.heads[LM_HEAD[family]].decoder.parameters()}
        if family == "awd-lstm":
            vocab_sized[id(model.embeddings.weight)] = model.embeddings.weight
        vocab = sum(p.numel() for p in vocab_sized.values())
        assert config.num_parameters() == built, size
        assert config.num_parameters(include_embeddings=False) == built - vocab, size


@pytest.mark.parametrize("case", list(CASES))
def test_parameter_counts_of_variants(case):
    config = config_of(case)
    model = build_model(config, [LM_HEAD[config.family]])
    assert config.num_parameters() == sum(p.numel() for p in model.parameters())
    assert model.num_parameters() == config.num_parameters()


def test_the_paper_sizes_have_the_published_counts():
    """ELMo's biLM without its softmax: 93.6M (Peters et al. 2018; AllenNLP's "Original"
    model); AWD-LSTM's 400/1150/3 stack with a 10k vocabulary: 24M (Merity et al. 2017, PTB)."""
    elmo = preset_config("elmo")
    assert elmo.num_parameters(include_embeddings=False) == pytest.approx(93.6e6, rel=0.001)  # tol: published as 93.6M
    assert recurrent_preset("awd-lstm", "paper", vocab_size=10_000).num_parameters() == \
        pytest.approx(24e6, rel=0.01)  # tol: published as 24M


@pytest.mark.parametrize("case", list(CASES))
def test_forward_flops_equal_the_flop_counter(case):
    torch.manual_seed(0)
    config = config_of(case)
    ids = torch.randint(1, V, (B, T))
    model = build_model(config, [LM_HEAD[config.family]]).eval()
    measured, by_op = measure_flops(model, {"input_ids": ids}, training=False)
    assert measured / (B * T) == pytest.approx(
        config.flops_per_token(T, training=False, head="clm"), rel=1e-12), by_op
    bare = build_model(config).eval()  # no head: no softmax
    measured, _ = measure_flops(bare, {"input_ids": ids}, training=False)
    assert measured / (B * T) == pytest.approx(
        config.flops_per_token(T, training=False, head="none"), rel=1e-12)
    if config.family == "elmo":
        assert by_op["aten.convolution"] / (B * T) == config.flop_parts(False)[
            "character convolutions"]


@pytest.mark.parametrize("case", ["awd-lstm tiny", "elmo tiny"])
def test_training_flops_are_three_forwards_less_the_initial_state_gradient(case):
    torch.manual_seed(0)
    config = config_of(case)
    ids = torch.randint(1, V, (B, T))
    model = build_model(config, [LM_HEAD[config.family]]).train()
    measured, _ = measure_flops(model, {"input_ids": ids, "labels": ids}, training=True)
    analytic = B * T * config.flops_per_token(T, training=True, head="clm")
    assert measured == pytest.approx(analytic - B * skipped_initial_state_gradient(config),
                                     rel=1e-12)


def test_flop_count_does_not_depend_on_length_and_scales_the_softmax():
    config = recurrent_preset("awd-lstm", "tiny", vocab_size=V)
    assert config.flops_per_token(16) == config.flops_per_token(512)
    full, tenth = config.flop_parts(), config.flop_parts(sparse_prediction_fraction=0.1)
    assert tenth["softmax"] == pytest.approx(full["softmax"] / 10)
    assert tenth["LSTM gates"] == full["LSTM gates"]
    assert default_head(config) == "clm" and default_head(preset_config("elmo")) == "clm"
    with pytest.raises(LmlabError, match="has no 'mlm' head"):
        config.flops_per_token(16, head="mlm")


def test_cost_estimate_and_flops_commands_know_the_recurrent_models(capsys):
    assert main(["cost", "estimate", "--model", "awd-lstm-paper", "--tokens", "100M",
                 "--device", "v100", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    config = preset_config("awd-lstm-paper")
    assert data["flops_per_token"] == config.flops_per_token(training=True)
    assert data["total_flops"] == pytest.approx(1e8 * data["flops_per_token"])
    assert any("LSTM gate" in line for line in data["assumptions"])
    assert main(["cost", "flops", "--model", "elmo-tiny", "--forward"]) == 0
    out = capsys.readouterr().out
    tiny = preset_config("elmo-tiny")
    assert f"{tiny.num_parameters():,} parameters" in out
    assert "character convolutions" in out and "LSTM projections" in out
    assert f"**{tiny.flops_per_token(training=False):,.0f}**" in out
    assert main(["cost", "estimate", "--model", "elmo", "--tokens", "1e9", "--head",
                 "mlm"]) == 2
    assert "has no 'mlm' head" in capsys.readouterr().err


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return kjv_shards(tmp_path_factory, 6, 1)


@pytest.mark.parametrize("family", ["awd-lstm", "elmo"])
def test_pretraining_cost_report_uses_the_recurrent_counts(family, shards, tmp_path,
                                                           monkeypatch):
    """cost.json of `lmlab pretrain --family awd-lstm|elmo`: the built model's parameters and
    the LSTM FLOPs per token, times the tokens trained (the peak, MFU's denominator, pinned:
    this host's is not the point)."""
    import lmlab

    monkeypatch.setattr("lmlab.cost.report.device_peak", lambda *_, **__: (1e11, "pinned"))
    result = lmlab.pretrain(lmlab.PretrainConfig.from_sections(
        None, family=family, size="tiny", objective=LM_HEAD[family], shards=str(shards),
        out=str(tmp_path / "run"), max_steps=2, batch_size=2, seq_len=16, eval_every=2,
        eval_batches=1, precision="fp32", progress=False, track_cost=True))
    cost = json.loads((tmp_path / "run" / "cost.json").read_text())
    model = lmlab.from_pretrained(tmp_path / "run")
    assert cost["parameters"] == sum(p.numel() for p in model.parameters())
    assert cost["flops_per_token"] == model.config.flops_per_token(training=True, head="clm")
    assert cost["flops"] == pytest.approx(cost["tokens"] * cost["flops_per_token"])
    assert "LSTM gate" in " ".join(cost["notes"]) and result.cost is not None
