"""BERT (Devlin et al. 2019): post-norm encoder, learned positions, segment embeddings.

Presets and their sources: docs/models.md. The names and helpers here serve every BERT-like
encoder.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from lmlab.models.config import TransformerConfig
from lmlab.models.families import BERT_TASK_HEADS, FamilySpec, Rule, paired_rules, stack_size
from lmlab.utils.errors import LmlabError

#: What makes a config a BERT-like encoder (post-norm, learned absolute positions, biases).
ENCODER_SHAPE: dict[str, Any] = dict(
    position_embedding="learned", norm_type="layernorm", pre_norm=False, embedding_norm=True,
    final_norm=False, ffn_type="mlp", causal=False, attention_bias=True, mlp_bias=True)
ENCODER_HF_NAMES = {name: name for name in (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
    "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob",
    "max_position_embeddings", "type_vocab_size", "initializer_range")} | {
    "layer_norm_eps": "norm_eps", "pad_token_id": "pad_token_id", "bos_token_id": "bos_token_id",
    "eos_token_id": "eos_token_id", "tie_word_embeddings": "tie_word_embeddings"}
SIZE_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
ENCODER_REQUIRED = (*SIZE_FIELDS, "intermediate_size")
#: lmlab's names of a layer's eight modules, in the order the families' tables list theirs
LAYER_MODULES = ("attention.q_proj", "attention.k_proj", "attention.v_proj", "attention.o_proj",
                 "attention_norm", "feed_forward.up_proj", "feed_forward.down_proj", "ffn_norm")


#: BERT's sizes (Turc et al. 2019 below base, Devlin et al. 2019), also RoFormer's
BERT_SIZES = {size: stack_size(hidden, layers) for size, (hidden, layers) in {
    "tiny": (128, 2), "mini": (256, 4), "small": (512, 4), "medium": (512, 8),
    "base": (768, 12), "large": (1024, 24)}.items()}


def layer_rules(theirs: str, names: tuple[str, ...], layer: str = "transformer.layers.{i}."
                ) -> list[Rule]:
    """Weight and bias rules of a post-norm layer: :data:`LAYER_MODULES` <- ``names``."""
    return paired_rules(layer, theirs, zip(LAYER_MODULES, names))


def projection_rules(theirs: str) -> list[Rule]:
    """The factorised embeddings' E -> H projection (ALBERT, ELECTRA, RoFormer)."""
    return paired_rules("transformer.embeddings.projection", theirs, [("", "")])


def drop_equal_embedding_size(values: dict[str, Any]) -> None:
    """An ``embedding_size`` equal to the hidden size is no factorisation: None."""
    if values.get("embedding_size") == values["hidden_size"]:
        values["embedding_size"] = None


def check_absolute_positions(hf: dict[str, Any], values: dict[str, Any]) -> None:
    """Refuse relative position embeddings (``position_embedding_type``)."""
    position_type = hf.get("position_embedding_type", "absolute")
    if position_type not in (None, "absolute"):
        raise LmlabError(f"position_embedding_type {position_type!r} is not supported",
                         "lmlab reads BERT-family checkpoints with absolute positions")


def bert_layer_rules() -> list[Rule]:
    """BERT's per-layer names (shared by RoBERTa, ELECTRA and RoFormer)."""
    return layer_rules("encoder.layer.{i}.", (
        "attention.self.query", "attention.self.key", "attention.self.value",
        "attention.output.dense", "attention.output.LayerNorm", "intermediate.dense",
        "output.dense", "output.LayerNorm"))


def bert_embedding_rules(config: TransformerConfig) -> list[Rule]:
    """BERT's embedding names: the word table, the position table (DistilBERT's may be stored
    sinusoids; RoFormer's rotary positions have none), the norm, the token types if any."""
    position = {"learned": "position_embeddings.weight", "sinusoidal": "sinusoids"}
    pairs = [("word_embeddings.weight", "word_embeddings.weight")]
    if config.position_embedding in position:
        pairs.append((position[config.position_embedding], "position_embeddings.weight"))
    pairs += [("norm.weight", "LayerNorm.weight"), ("norm.bias", "LayerNorm.bias")]
    if config.type_vocab_size > 0:
        pairs.append(("token_type_embeddings.weight", "token_type_embeddings.weight"))
    return [Rule(f"transformer.embeddings.{ours}", f"embeddings.{theirs}") for ours, theirs in pairs]


def bert_rules(config: TransformerConfig) -> list[Rule]:
    """The bare model of ELECTRA and RoFormer: BERT's embeddings and layers (RoFormer's query
    and key rows stored as rotation pairs), the factorised embeddings' projection if E != H."""
    rotated = ("attention.self.query.", "attention.self.key.")
    rotary = config.position_embedding == "rotary"
    rules = bert_embedding_rules(config) + [
        replace(rule, rotary_pairs=rotary and any(name in rule.theirs for name in rotated))
        for rule in bert_layer_rules()]
    if config.input_embedding_size != config.hidden_size:
        rules += projection_rules("embeddings_project")
    return rules


def mlm_rules(prefix: str, decoder: str = "decoder", bias: str | None = "bias",
              transform: str = "transform.dense", norm: str = "transform.LayerNorm",
              tied: bool = True) -> list[Rule]:
    """Masked-LM head names under ``prefix`` (``cls.predictions.`` for BERT)."""
    rules = paired_rules("heads.mlm.", prefix, [("dense", transform), ("norm", norm)])
    rules.append(Rule("heads.mlm.decoder.weight", f"{prefix}{decoder}.weight", optional=tied))
    bias_name = f"{prefix}{bias}" if bias else f"{prefix}{decoder}.bias"
    rules.append(Rule("heads.mlm.decoder.bias", bias_name, aliases=(f"{prefix}{decoder}.bias",)))
    return rules


FAMILY = FamilySpec(
    model_type="bert",
    display_name="BERT",
    base_prefix="bert",
    shape=ENCODER_SHAPE,
    sizes=BERT_SIZES,
    hf_names=ENCODER_HF_NAMES,
    hf_constants={"position_embedding_type": "absolute"},
    required=ENCODER_REQUIRED,
    from_hf=check_absolute_positions,
    base_rules=lambda config: bert_embedding_rules(config) + bert_layer_rules(),
    pooler_rules=paired_rules("", "", [("pooler.dense", "pooler.dense")]),
    head_rules={
        "mlm": lambda config: mlm_rules("cls.predictions.", tied=config.tie_word_embeddings),
        "nsp": lambda config: paired_rules("heads.nsp.", "cls.",
                                           [("classifier", "seq_relationship")]),
    },
    architectures={
        "BertModel": (),
        "BertForMaskedLM": ("mlm",),
        "BertForPreTraining": ("mlm", "nsp"),
        "BertForNextSentencePrediction": ("nsp",),
    },
    task_heads=BERT_TASK_HEADS,
)
