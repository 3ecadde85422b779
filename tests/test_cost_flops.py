"""Analytic FLOPs vs torch's FlopCounterMode on real forward+backward passes.

transformers is the reference here (test-time only). Both sides count matrix products only
(2 FLOPs per multiply-add; FlopCounterMode ignores elementwise ops, and so do our formulas), so
they must agree exactly, not "within a few %": the tolerance below is float rounding. A failure
means a matmul the formula misses or invents. The models run with eager attention because
torch 2.13's flop counter has no formula for the CPU fused attention kernel.
"""

from __future__ import annotations

import pytest

from lmlab.cost.flop_counter import compare_with_analytic, measure_flops
from lmlab.cost.flops import (
    flops_breakdown,
    flops_per_token,
    parse_seq_len_schedule,
    schedule_flops_per_token,
)
from lmlab.cost.presets import preset_config, preset_names
from lmlab.models.config import TransformerConfig
from lmlab.utils.errors import LmlabError

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

B, S, V = 2, 16, 512


def _ids():
    return torch.randint(0, V, (B, S))


def _check(model, config, head, training=True):
    ids = _ids()
    inputs = {"input_ids": ids, "labels": ids} if training else {"input_ids": ids}
    result = compare_with_analytic(model, inputs, config, S, B * S, training=training, head=head)
    assert result["ratio"] == pytest.approx(1.0, rel=1e-9), result


def test_bert_mlm_training_matches_flop_counter():
    hf = transformers.BertConfig(vocab_size=V, hidden_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, intermediate_size=128,
                                 max_position_embeddings=64, attn_implementation="eager")
    ours = TransformerConfig(vocab_size=V, hidden_size=64, num_hidden_layers=2,
                             num_attention_heads=4, intermediate_size=128,
                             max_position_embeddings=64)
    _check(transformers.BertForMaskedLM(hf), ours, "mlm")


def test_bert_forward_only_matches_flop_counter():
    hf = transformers.BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, intermediate_size=64,
                                 max_position_embeddings=64, attn_implementation="eager")
    ours = TransformerConfig(vocab_size=V, hidden_size=32, num_hidden_layers=1,
                             num_attention_heads=2, intermediate_size=64)
    model = transformers.BertForMaskedLM(hf).eval()
    _check(model, ours, "mlm", training=False)


def test_gpt2_clm_training_matches_flop_counter():
    hf = transformers.GPT2Config(vocab_size=V, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                 bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    ours = TransformerConfig(family="gpt2", vocab_size=V, hidden_size=64, num_hidden_layers=2,
                             num_attention_heads=4, intermediate_size=256, causal=True)
    _check(transformers.GPT2LMHeadModel(hf), ours, "clm")


def test_albert_factorised_shared_layers_match_flop_counter():
    # Shared weights still run once per layer; the E->H projection and H->E head transform
    # are matmuls of their own.
    hf = transformers.AlbertConfig(vocab_size=V, embedding_size=16, hidden_size=64,
                                   num_hidden_layers=3, num_attention_heads=4,
                                   intermediate_size=128, max_position_embeddings=64,
                                   attn_implementation="eager")
    ours = TransformerConfig(family="albert", vocab_size=V, embedding_size=16, hidden_size=64,
                             num_hidden_layers=3, num_attention_heads=4, intermediate_size=128,
                             share_layers=True)
    _check(transformers.AlbertForMaskedLM(hf), ours, "mlm")


def test_llama_gqa_swiglu_matches_flop_counter():
    hf = transformers.LlamaConfig(vocab_size=V, hidden_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2,
                                  intermediate_size=96, max_position_embeddings=64,
                                  attn_implementation="eager")
    ours = TransformerConfig(family="llama", vocab_size=V, hidden_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                             ffn_type="glu", causal=True, attention_bias=False, mlp_bias=False,
                             norm_type="rmsnorm")
    _check(transformers.LlamaForCausalLM(hf), ours, "clm")


def test_measure_flops_reports_per_operator_counts():
    layer = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8, requires_grad=True)
    total, by_op = measure_flops(layer, {"input": x}, training=True)
    # forward 2*3*8*4 = 192; backward: grad input 192 + grad weight 192
    assert total == 3 * 192
    assert sum(by_op.values()) == total
    # An input that needs no gradient skips one backward product: in a Transformer the
    # embeddings are trained, so the first matmul's input gradient is always computed.
    total, _ = measure_flops(layer, {"input": x.detach()}, training=True)
    assert total == 2 * 192
    total, _ = measure_flops(layer, {"input": x}, training=False)
    assert total == 192


def test_breakdown_matches_the_closed_form_for_bert_base():
    config = preset_config("bert-base")
    h, layers, f, v, s = 768, 12, 3072, 30522, 128
    b = flops_breakdown(config, s)
    assert b.attention_projections == 6 * layers * 4 * h * h
    assert b.ffn == 6 * layers * 2 * h * f
    assert b.attention_scores == 12 * layers * s * h
    assert b.output_projection == 6 * h * v
    assert b.head_transform == 6 * h * h
    assert b.total == pytest.approx(sum(b.parts().values()))
    # PERF-NOTES: the vocabulary projection is ~21% of bert-base's and ~70% of bert-mini's.
    assert b.output_projection / b.total == pytest.approx(0.21, abs=0.01)  # tol: PERF-NOTES's 2 digits
    mini = flops_breakdown(preset_config("bert-mini"), s)
    assert mini.output_projection / mini.total == pytest.approx(0.70, abs=0.02)  # tol: PERF-NOTES: ~70%


def test_sparse_prediction_scales_only_the_head():
    config = preset_config("bert-base")
    full = flops_breakdown(config, 128)
    sparse = flops_breakdown(config, 128, sparse_prediction_fraction=0.15)
    assert sparse.output_projection == pytest.approx(0.15 * full.output_projection)
    assert sparse.head_transform == pytest.approx(0.15 * full.head_transform)
    assert sparse.ffn == full.ffn and sparse.attention_scores == full.attention_scores
    with pytest.raises(LmlabError):
        flops_breakdown(config, 128, sparse_prediction_fraction=0.0)


def test_causal_half_counting_only_affects_causal_models():
    gpt = preset_config("gpt2-small")
    full = flops_breakdown(gpt, 1024, head="clm")
    half = flops_breakdown(gpt, 1024, head="clm", causal_attention="half")
    assert half.attention_scores == full.attention_scores / 2
    bert = preset_config("bert-base")
    assert (flops_breakdown(bert, 512, causal_attention="half").attention_scores
            == flops_breakdown(bert, 512).attention_scores)


def test_forward_is_a_third_of_training_and_heads_differ():
    config = preset_config("gpt2-small")
    assert flops_per_token(config, 256, training=False, head="clm") * 3 == pytest.approx(
        flops_per_token(config, 256, head="clm"))
    none = flops_breakdown(config, 256, head="none")
    assert none.output_projection == 0 and none.head_transform == 0


def test_shared_layers_cost_the_same_compute():
    shared = preset_config("albert-base")
    unshared = TransformerConfig(**{**shared.to_dict(), "share_layers": False})
    assert flops_per_token(shared, 128) == flops_per_token(unshared, 128)
    assert shared.num_parameters() < unshared.num_parameters()


def test_schedule_weights_lengths_by_tokens():
    config = preset_config("bert-base")
    schedule = parse_seq_len_schedule("128:0.9,512:0.1")
    assert schedule == [(128, 0.9), (512, 0.1)]
    mixed = schedule_flops_per_token(config, schedule)
    w128, w512 = 0.9 * 128, 0.1 * 512
    expected = (w128 * flops_per_token(config, 128) + w512 * flops_per_token(config, 512)) / (
        w128 + w512)
    assert mixed == pytest.approx(expected)
    assert parse_seq_len_schedule(256) == [(256, 1.0)]
    for bad in ("128:0.5,512:0.1", "abc", "0", "128:-1"):
        with pytest.raises(LmlabError):
            parse_seq_len_schedule(bad)


def test_presets_have_the_published_parameter_counts():
    counts = {name: preset_config(name).num_parameters() for name in preset_names()}
    assert counts["gpt2-small"] == 124_439_808  # GPT2LMHeadModel, tied head
    assert counts["smollm2-135m"] == pytest.approx(134.5e6, rel=0.01)  # tol: rounded (135M)
    assert counts["bert-base"] == pytest.approx(109.5e6, rel=0.01)  # tol: rounded (110M); HF adds a 0.6M pooler
    assert counts["bert-large"] == pytest.approx(335e6, rel=0.01)  # tol: rounded (335M)
    with pytest.raises(LmlabError, match="unknown model size"):
        preset_config("bert-gigantic")


def test_bad_arguments_raise_lmlab_errors():
    config = preset_config("bert-tiny")
    with pytest.raises(LmlabError):
        flops_per_token(config, 0)
    with pytest.raises(LmlabError):
        flops_per_token(config, 128, head="seq2seq")
    with pytest.raises(LmlabError):
        flops_per_token(TransformerConfig(add_cross_attention=True), 128)


@pytest.mark.parametrize("kind", ["bert-mlm", "llama-clm", "albert-mlm"])
def test_lmlab_models_match_flop_counter(kind):
    """The analytic count also holds for lmlab's own models (math attention path, which the
    flop counter can see; the fused path computes the same products)."""
    from lmlab.models.model import LanguageModel

    base = dict(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=128, max_position_embeddings=64)
    if kind == "llama-clm":
        config = TransformerConfig(**base, family="llama", causal=True, num_key_value_heads=2,
                                   position_embedding="rotary", norm_type="rmsnorm",
                                   pre_norm=True, final_norm=True, embedding_norm=False,
                                   type_vocab_size=0, ffn_type="glu", hidden_act="silu",
                                   attention_bias=False, mlp_bias=False, pad_token_id=None)
        head = "clm"
    else:
        extra = {"embedding_size": 32, "share_layers": True} if kind == "albert-mlm" else {}
        config = TransformerConfig(**base, **extra)
        head = "mlm"
    model = LanguageModel(config, heads=[head])
    ids = _ids()
    inputs = {"input_ids": ids, "labels": ids, "output_attentions": True}
    result = compare_with_analytic(model, inputs, config, S, B * S, training=True, head=head)
    assert result["ratio"] == pytest.approx(1.0, rel=1e-9), result


@pytest.mark.parametrize("family", ["bart", "t5"])
def test_encoder_decoder_step_matches_flop_counter(family):
    """An encoder-decoder's step (source 16, target 12 tokens; 2 encoder, 3 decoder layers;
    T5 v1.1's gated feed-forward) costs what seq2seq_step_flops says: encoder, decoder
    self-attention, cross-attention (keys and values once per source token) and the head."""
    from lmlab.cost.flops import seq2seq_step_flops
    from lmlab.models.families import get_family
    from lmlab.models.seq2seq import EncoderDecoderModel

    shape = dict(hidden_size=32, num_hidden_layers=2, num_decoder_layers=3,
                 num_attention_heads=4, intermediate_size=64, vocab_size=V)
    if family == "t5":
        shape.update(ffn_type="glu", hidden_act="gelu_new")
    else:
        shape["max_position_embeddings"] = 64
    config = get_family(family).config(**shape)
    model = EncoderDecoderModel(config, heads=["seq2seq-lm"])
    source, target = torch.randint(3, V, (B, 16)), torch.randint(3, V, (B, 12))
    total, _ = measure_flops(model, {"input_ids": source, "labels": target,
                                     "output_attentions": True})
    assert total == pytest.approx(seq2seq_step_flops(config, B * 16, 16, B * 12, 12),
                                  rel=1e-9)
    with pytest.raises(LmlabError, match="seq2seq_step_flops"):
        flops_per_token(config, 16)


def test_trainer_reports_the_cost_of_an_encoder_decoder(tmp_path):
    """The Trainer counts each step's source and target tokens into the cost report."""
    from lmlab.cost.flops import seq2seq_step_flops
    from lmlab.models.families import get_family
    from lmlab.models.seq2seq import EncoderDecoderModel
    from lmlab.objectives.seq2seq import seq2seq_loss
    from lmlab.training import TrainingConfig
    from lmlab.training.trainer import Trainer

    config = get_family("bart").config(hidden_size=32, num_hidden_layers=1,
                                       num_decoder_layers=1, num_attention_heads=2,
                                       intermediate_size=64, vocab_size=V,
                                       max_position_embeddings=64)
    model = EncoderDecoderModel(config, heads=["seq2seq-lm"])
    labels = torch.randint(3, V, (B, 6))
    labels[0, 4:] = -100  # a shorter target: its padding is not computed work
    batch = {"input_ids": torch.randint(3, V, (B, 10)),
             "attention_mask": torch.ones(B, 10, dtype=torch.long), "labels": labels}

    class Objective(torch.nn.Module):
        flops_head = "clm"
        predicted_fraction = None

        def compute_loss(self, model, batch):
            return seq2seq_loss(model, batch)

    cfg = TrainingConfig(max_steps=2, batch_size=B, seq_len=10, progress=False, device="cpu")
    run = Trainer(model, Objective(), iter([batch, batch]), cfg, tmp_path / "run",
                  measure_peak=False, save_model=False).train()
    assert run.cost["tokens"] == 2 * B * 10
    assert run.cost["flops"] == pytest.approx(2 * seq2seq_step_flops(config, B * 10, 10, 10, 6),
                                              rel=1e-9)
