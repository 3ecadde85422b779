"""BERT (Devlin et al. 2019): post-norm encoder, learned positions, segment embeddings.

Presets: tiny / mini / small / medium from Turc et al. 2019, "Well-Read Students Learn Better"
(L2/H128, L4/H256, L4/H512, L8/H512); base (L12/H768) and large (L24/H1024) from Devlin et al.
2019. Heads = H / 64, feed-forward 4H; everything else is :class:`TransformerConfig`'s defaults,
which are BERT-base's. The names and helpers here are shared by the BERT-like encoders.
"""

from __future__ import annotations

from typing import Any

from lmlab.models.config import TransformerConfig
from lmlab.models.families import BERT_TASK_HEADS, FamilySpec, Rule
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


def encoder_size(hidden: int, layers: int, **fields: Any) -> dict[str, Any]:
    """A BERT-style size: heads of 64 dimensions, a feed-forward 4x as wide."""
    return dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=hidden // 64,
                intermediate_size=4 * hidden, **fields)


def check_absolute_positions(hf: dict[str, Any], values: dict[str, Any]) -> None:
    """Refuse relative position embeddings (``position_embedding_type``)."""
    position_type = hf.get("position_embedding_type", "absolute")
    if position_type not in (None, "absolute"):
        raise LmlabError(f"position_embedding_type {position_type!r} is not supported",
                         "lmlab reads BERT-family checkpoints with absolute positions")


def bert_layer_rules() -> list[Rule]:
    """BERT's per-layer names (shared by RoBERTa and ELECTRA)."""
    ours, prefix = "transformer.layers.{i}.", "encoder.layer.{i}."
    pairs = [
        ("attention.q_proj", "attention.self.query"),
        ("attention.k_proj", "attention.self.key"),
        ("attention.v_proj", "attention.self.value"),
        ("attention.o_proj", "attention.output.dense"),
        ("attention_norm", "attention.output.LayerNorm"),
        ("feed_forward.up_proj", "intermediate.dense"),
        ("feed_forward.down_proj", "output.dense"),
        ("ffn_norm", "output.LayerNorm"),
    ]
    return [Rule(f"{ours}{a}.{p}", f"{prefix}{b}.{p}") for a, b in pairs for p in ("weight", "bias")]


def bert_embedding_rules(config: TransformerConfig) -> list[Rule]:
    rules = [
        Rule("transformer.embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight"),
        Rule("transformer.embeddings.position_embeddings.weight",
             "embeddings.position_embeddings.weight"),
        Rule("transformer.embeddings.norm.weight", "embeddings.LayerNorm.weight"),
        Rule("transformer.embeddings.norm.bias", "embeddings.LayerNorm.bias"),
    ]
    if config.type_vocab_size > 0:
        rules.append(Rule("transformer.embeddings.token_type_embeddings.weight",
                          "embeddings.token_type_embeddings.weight"))
    return rules


def mlm_rules(prefix: str, decoder: str = "decoder", bias: str | None = "bias",
              transform: str = "transform.dense", norm: str = "transform.LayerNorm",
              tied: bool = True) -> list[Rule]:
    """Masked-LM head names under ``prefix`` (``cls.predictions.`` for BERT)."""
    rules = [
        Rule("heads.mlm.dense.weight", f"{prefix}{transform}.weight"),
        Rule("heads.mlm.dense.bias", f"{prefix}{transform}.bias"),
        Rule("heads.mlm.norm.weight", f"{prefix}{norm}.weight"),
        Rule("heads.mlm.norm.bias", f"{prefix}{norm}.bias"),
        Rule("heads.mlm.decoder.weight", f"{prefix}{decoder}.weight", optional=tied),
    ]
    bias_name = f"{prefix}{bias}" if bias else f"{prefix}{decoder}.bias"
    rules.append(Rule("heads.mlm.decoder.bias", bias_name, aliases=(f"{prefix}{decoder}.bias",)))
    return rules


FAMILY = FamilySpec(
    model_type="bert",
    display_name="BERT",
    base_prefix="bert",
    shape=ENCODER_SHAPE,
    sizes={size: encoder_size(hidden, layers) for size, (hidden, layers) in {
        "tiny": (128, 2), "mini": (256, 4), "small": (512, 4), "medium": (512, 8),
        "base": (768, 12), "large": (1024, 24)}.items()},
    hf_names=ENCODER_HF_NAMES,
    hf_constants={"position_embedding_type": "absolute"},
    required=(*SIZE_FIELDS, "intermediate_size"),
    from_hf=check_absolute_positions,
    base_rules=lambda config: bert_embedding_rules(config) + bert_layer_rules(),
    pooler_rules=[Rule("pooler.dense.weight", "pooler.dense.weight"),
                  Rule("pooler.dense.bias", "pooler.dense.bias")],
    head_rules={
        "mlm": lambda config: mlm_rules("cls.predictions.", tied=config.tie_word_embeddings),
        "nsp": lambda config: [Rule("heads.nsp.classifier.weight", "cls.seq_relationship.weight"),
                               Rule("heads.nsp.classifier.bias", "cls.seq_relationship.bias")],
    },
    architectures={
        "BertModel": (),
        "BertForMaskedLM": ("mlm",),
        "BertForPreTraining": ("mlm", "nsp"),
        "BertForNextSentencePrediction": ("nsp",),
    },
    task_heads=BERT_TASK_HEADS,
)
