"""BERT (Devlin et al. 2019): post-norm encoder, learned positions, segment embeddings."""

from __future__ import annotations

from typing import Any

from lmlab.interop.families import FamilySpec, Rule, pick
from lmlab.models.config import TransformerConfig
from lmlab.utils.errors import LmlabError


def encoder_config_from_hf(hf: dict[str, Any], family: str, **overrides: Any) -> TransformerConfig:
    """Fields shared by the BERT-like encoders' config.json files."""
    position_type = hf.get("position_embedding_type", "absolute")
    if position_type not in (None, "absolute"):
        raise LmlabError(f"position_embedding_type {position_type!r} is not supported",
                         "lmlab reads BERT-family checkpoints with absolute positions")
    values = dict(
        family=family,
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_hidden_layers=hf["num_hidden_layers"],
        num_attention_heads=hf["num_attention_heads"],
        intermediate_size=hf["intermediate_size"],
        hidden_act=hf.get("hidden_act", "gelu"),
        hidden_dropout_prob=hf.get("hidden_dropout_prob", 0.1),
        attention_probs_dropout_prob=hf.get("attention_probs_dropout_prob", 0.1),
        max_position_embeddings=hf.get("max_position_embeddings", 512),
        type_vocab_size=hf.get("type_vocab_size", 2),
        initializer_range=hf.get("initializer_range", 0.02),
        norm_eps=pick(hf, "layer_norm_eps", default=1e-12),
        pad_token_id=hf.get("pad_token_id", 0),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=hf.get("eos_token_id"),
        tie_word_embeddings=hf.get("tie_word_embeddings", True),
    )
    values.update(overrides)
    return TransformerConfig(**values)


def encoder_config_to_hf(config: TransformerConfig, model_type: str) -> dict[str, Any]:
    return {
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "intermediate_size": config.intermediate_size,
        "hidden_act": config.hidden_act,
        "hidden_dropout_prob": config.hidden_dropout_prob,
        "attention_probs_dropout_prob": config.attention_probs_dropout_prob,
        "max_position_embeddings": config.max_position_embeddings,
        "type_vocab_size": config.type_vocab_size,
        "initializer_range": config.initializer_range,
        "layer_norm_eps": config.norm_eps,
        "pad_token_id": config.pad_token_id,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": config.tie_word_embeddings,
    }


def bert_layer_rules(prefix: str = "encoder.layer.{i}.") -> list[Rule]:
    """BERT's per-layer names (shared by RoBERTa and ELECTRA)."""
    ours = "transformer.layers.{i}."
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


def _base_rules(config: TransformerConfig) -> list[Rule]:
    return bert_embedding_rules(config) + bert_layer_rules()


FAMILY = FamilySpec(
    model_type="bert",
    base_prefix="bert",
    config_from_hf=lambda hf: encoder_config_from_hf(hf, "bert"),
    config_to_hf=lambda config: encoder_config_to_hf(config, "bert"),
    base_rules=_base_rules,
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
)
