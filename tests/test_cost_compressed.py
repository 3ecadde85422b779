"""Parameter and FLOP counts of compressed layouts, from the config alone: heads pruned to
different counts per layer (lmlab.compress.heads) and low-rank factorised linear maps
(lmlab.compress.lowrank), alone and together, on a tiny BERT and a tiny Llama (multi-head).

References: the parameters the model really holds (``count_parameters``), and the matrix
products torch's ``FlopCounterMode`` counts in a real forward and backward pass (the math
attention path, ``output_attentions=True``, so that the scores are counted on CPU). Both count
exactly what the formulas count, so the comparison is exact.
"""

from __future__ import annotations

import pytest
import torch

from lmlab.compress.heads import prune_heads
from lmlab.compress.lowrank import low_rank
from lmlab.cost.flop_counter import measure_flops
from lmlab.cost.flops import flops_breakdown
from lmlab.models.families import get_family
from lmlab.models.model import LanguageModel, count_parameters
from lmlab.models.variants import factorised_shapes

B, S = 2, 7
SIZES = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48,
             vocab_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
             attention_probs_dropout_prob=0.0)


def _model(family: str) -> LanguageModel:
    torch.manual_seed(0)
    extra = dict(num_key_value_heads=4) if family == "llama" else {}
    return LanguageModel(get_family(family).config(**SIZES, **extra)).eval()


def _compress(model: LanguageModel, how: str) -> None:
    if how in ("heads", "both"):
        prune_heads(model, {0: [1, 2], 2: [0]})  # 2, 4, 3 heads left
    if how in ("lowrank", "both"):
        low_rank(model, rank=5, modules=["q_proj", "o_proj", "down_proj"])
        assert model.config.extra["low_rank"]


def _measured_flops(model: LanguageModel, training: bool) -> int:
    ids = torch.randint(0, SIZES["vocab_size"], (B, S), generator=torch.Generator().manual_seed(1))
    total, _ = measure_flops(model.transformer, {"input_ids": ids, "output_attentions": True},
                             training=training,
                             loss_fn=lambda out: out.last_hidden_state.sum())
    return total


@pytest.mark.parametrize("family", ["bert", "llama"])
@pytest.mark.parametrize("how", ["heads", "lowrank", "both"])
def test_compressed_counts_follow_the_actual_layout(family, how):
    model = _model(family)
    _compress(model, how)
    config = model.config
    assert config.num_parameters() == count_parameters(model.transformer)
    for training in (False, True):
        analytic = flops_breakdown(config, S, training=training, head="none").total * B * S
        assert _measured_flops(model, training) == pytest.approx(analytic, rel=1e-12), training


def test_formula_by_hand_on_a_pruned_and_factorised_model():
    """Against the formula written out: per-layer heads in the projections and the scores,
    a factorised map at 2 r (in + out) per token."""
    model = _model("bert")
    _compress(model, "both")
    config = model.config
    h, hd, f, r = 32, 8, 48, 5
    heads = [2, 4, 3]
    expected = 0.0
    for n in heads:
        q = n * hd
        expected += 2 * r * (h + q) + 2 * 2 * h * q + 2 * r * (q + h)  # q low-rank, k, v, o low-rank
        expected += 4 * S * q  # scores
        expected += 2 * h * f + 2 * r * (f + h)  # up, down low-rank
    assert flops_breakdown(config, S, training=False, head="none").total == expected
    assert [shape[1:] for shape in factorised_shapes(config)][:2] == [(h, 2 * hd, r),
                                                                   (2 * hd, h, r)]


def test_compressed_counts_survive_saving(tmp_path):
    """The counts come from the config: a reloaded model gives the same ones."""
    import lmlab
    from lmlab.interop.native import save_model

    model = _model("bert")
    _compress(model, "both")
    save_model(model, tmp_path / "m")
    again = lmlab.from_pretrained(tmp_path / "m")
    assert again.config.num_parameters() == model.config.num_parameters() \
        == count_parameters(again.transformer)
    assert flops_breakdown(again.config, S).total == flops_breakdown(model.config, S).total


def test_a_factorised_encoder_decoder_counts_each_stacks_own_maps():
    """An encoder-decoder names its maps "encoder.layers.i..." and "decoder.layers.i...":
    each stack counts its own factorised maps, the cross-attention's keys and values per
    source token, its queries and outputs per target token (FlopCounterMode as reference)."""
    from lmlab.cost.flops import seq2seq_step_flops
    from lmlab.models.seq2seq import EncoderDecoderModel

    torch.manual_seed(0)
    config = get_family("bart").config(**SIZES, num_decoder_layers=2)
    model = EncoderDecoderModel(config, heads=["seq2seq-lm"]).eval()
    low_rank(model, rank=5, modules=["q_proj", "k_proj", "up_proj"])
    names = model.config.extra["low_rank"]
    assert any(n.startswith("encoder.") for n in names) and any(".cross_attention." in n
                                                                for n in names)
    source = torch.randint(0, SIZES["vocab_size"], (B, S))
    target = torch.randint(0, SIZES["vocab_size"], (B, 5))
    for training in (False, True):
        measured, _ = measure_flops(model, {"input_ids": source, "decoder_input_ids": target,
                                            "output_attentions": True}, training=training,
                                    loss_fn=lambda out: out.logits.sum())
        analytic = seq2seq_step_flops(model.config, B * S, S, B * 5, 5, training=training)
        assert measured == pytest.approx(analytic, rel=1e-12), training
