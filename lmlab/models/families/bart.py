"""BART (Lewis et al. 2020): a post-norm encoder-decoder in fairseq's layout (docs/encoder-decoders.md).

Positions are numbered from 2 (``max_position_embeddings`` counts the table's rows); both stacks
have one width. ``fairseq_layout_rules`` also serve Marian. Presets: the released base and large.
"""

from __future__ import annotations

from typing import Any

from lmlab.models.config import TransformerConfig
from lmlab.models.families import FamilySpec, Rule, paired_rules, stack_size
from lmlab.utils.errors import LmlabError

#: config.json keys of the fairseq-layout families (BART, Marian) -> TransformerConfig fields
FAIRSEQ_HF_NAMES = {
    "vocab_size": "vocab_size", "d_model": "hidden_size",
    "encoder_layers": "num_hidden_layers", "decoder_layers": "num_decoder_layers",
    "encoder_attention_heads": "num_attention_heads", "encoder_ffn_dim": "intermediate_size",
    "activation_function": "hidden_act", "max_position_embeddings": "max_position_embeddings",
    "dropout": "hidden_dropout_prob", "attention_dropout": "attention_probs_dropout_prob",
    "init_std": "initializer_range", "scale_embedding": "scale_embedding",
    "pad_token_id": "pad_token_id", "bos_token_id": "bos_token_id",
    "eos_token_id": "eos_token_id", "tie_word_embeddings": "tie_word_embeddings",
    "decoder_start_token_id": "extra.decoder_start_token_id",
    "forced_eos_token_id": "extra.forced_eos_token_id",
    "forced_bos_token_id": "extra.forced_bos_token_id",
    "bad_words_ids": "extra.bad_words_ids",
}
FAIRSEQ_SIZE_FIELDS = ("hidden_size", "num_hidden_layers", "num_decoder_layers",
                       "num_attention_heads", "intermediate_size", "vocab_size")
FAIRSEQ_SHAPE = dict(is_encoder_decoder=True, type_vocab_size=0, norm_type="layernorm",
                     pre_norm=False, final_norm=False, ffn_type="mlp", causal=False,
                     attention_bias=True, mlp_bias=True)


def check_symmetric_stacks(hf: dict[str, Any]) -> None:
    """Refuse a config.json whose decoder differs from its encoder in a width lmlab shares."""
    for encoder_key, decoder_key in (("encoder_attention_heads", "decoder_attention_heads"),
                                     ("encoder_ffn_dim", "decoder_ffn_dim")):
        if decoder_key in hf and encoder_key in hf and hf[decoder_key] != hf[encoder_key]:
            raise LmlabError(
                f"{encoder_key}={hf[encoder_key]} but {decoder_key}={hf[decoder_key]}: lmlab "
                "builds the encoder and the decoder with the same heads and feed-forward width",
                "use a checkpoint whose two stacks have the same shape")
    if hf.get("normalize_before") or hf.get("add_final_layer_norm"):
        raise LmlabError("this checkpoint is pre-norm (normalize_before / add_final_layer_norm: "
                         "mBART's layout), not BART's post-norm",
                         "lmlab reads post-norm BART and Marian checkpoints")


def write_both_stacks(config: TransformerConfig, hf: dict[str, Any]) -> None:
    """The decoder_* keys of config.json, equal to the encoder's."""
    hf["decoder_attention_heads"] = config.num_attention_heads
    hf["decoder_ffn_dim"] = config.intermediate_size
    hf["is_encoder_decoder"] = True


def _stack_rules(ours: str, theirs: str, cross: bool) -> list[Rule]:
    """One fairseq-layout layer: self-attention, optional cross-attention, fc1/fc2, norms."""
    parts = [("attention", "self_attn"), ("attention_norm", "self_attn_layer_norm"),
             ("feed_forward.up_proj", "fc1"), ("feed_forward.down_proj", "fc2"),
             ("ffn_norm", "final_layer_norm")]
    if cross:
        parts += [("cross_attention", "encoder_attn"),
                  ("cross_attention_norm", "encoder_attn_layer_norm")]
    rules = []
    for our_name, their_name in parts:
        if our_name.endswith("attention"):
            rules += paired_rules(f"{ours}{our_name}.", f"{theirs}{their_name}.", [
                (f"{p}_proj", "out_proj" if p == "o" else f"{p}_proj") for p in "qkvo"])
        else:
            rules += paired_rules(ours, theirs, [(our_name, their_name)])
    return rules


def fairseq_layout_rules(config: TransformerConfig) -> list[Rule]:
    """The bare model's tensors (names relative to ``model.``): the shared table (or, with
    ``share_embeddings`` off, each side's), each stack's positions and embedding norm where the
    config has them, and every layer."""
    shared = config.share_embeddings
    rules = [Rule("encoder.embeddings.word_embeddings.weight", "encoder.embed_tokens.weight",
                  optional=shared),
             Rule("decoder.embeddings.word_embeddings.weight", "decoder.embed_tokens.weight",
                  optional=shared)]
    if shared:  # the table both stacks read (their own names above: optional copies)
        rules.insert(0, Rule("encoder.embeddings.word_embeddings.weight", "shared.weight"))
    for stack in ("encoder", "decoder"):
        if config.position_embedding == "learned":
            rules.append(Rule(f"{stack}.embeddings.position_embeddings.weight",
                              f"{stack}.embed_positions.weight"))
        if config.embedding_norm:
            rules += paired_rules(f"{stack}.", f"{stack}.", [("embeddings.norm",
                                                             "layernorm_embedding")])
    rules += _stack_rules("encoder.layers.{i}.", "encoder.layers.{i}.", cross=False)
    rules += _stack_rules("decoder.layers.{j}.", "decoder.layers.{j}.", cross=True)
    return rules


def seq2seq_lm_rules(config: TransformerConfig) -> list[Rule]:
    """``lm_head.weight`` (absent from files when tied) and ``final_logits_bias``."""
    return [Rule("heads.seq2seq-lm.decoder.weight", "lm_head.weight",
                 optional=config.tie_word_embeddings),
            Rule("heads.seq2seq-lm.final_logits_bias", "final_logits_bias", optional=True)]


def from_hf(hf: dict[str, Any], values: dict[str, Any]) -> None:
    check_symmetric_stacks(hf)
    values["max_position_embeddings"] += values["position_offset"]  # the table's rows


def to_hf(config: TransformerConfig, hf: dict[str, Any]) -> None:
    if config.position_offset != 2:
        raise LmlabError(f"a BART checkpoint numbers positions from 2, but this config has "
                         f"position_offset={config.position_offset}",
                         "build the config from preset('bart', ...)")
    hf["max_position_embeddings"] = config.max_position_embeddings - config.position_offset
    write_both_stacks(config, hf)


FAMILY = FamilySpec(
    model_type="bart",
    display_name="BART",
    base_prefix="model",
    shape=dict(FAIRSEQ_SHAPE, position_embedding="learned", position_offset=2,
               embedding_norm=True, share_embeddings=True),
    defaults=dict(vocab_size=50265, hidden_act="gelu", max_position_embeddings=1026,
                  norm_eps=1e-5, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                  tie_word_embeddings=True, hidden_dropout_prob=0.1,
                  attention_probs_dropout_prob=0.0,
                  extra={"decoder_start_token_id": 2, "forced_eos_token_id": 2}),
    sizes={"base": stack_size(768, 6, num_decoder_layers=6),
           "large": stack_size(1024, 12, num_decoder_layers=12)},
    hf_names=FAIRSEQ_HF_NAMES,
    hf_defaults=dict(max_position_embeddings=1024, scale_embedding=False),
    required=FAIRSEQ_SIZE_FIELDS,
    from_hf=from_hf,
    to_hf=to_hf,
    base_rules=fairseq_layout_rules,
    head_rules={"seq2seq-lm": seq2seq_lm_rules},
    architectures={"BartModel": (), "BartForConditionalGeneration": ("seq2seq-lm",)},
)
