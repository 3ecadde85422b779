"""DistilBERT (Sanh et al. 2019): a 6-layer BERT without token types, under its own config
names; its stored sinusoid table loads into lmlab's ``sinusoids`` buffer (docs/models.md)."""

from __future__ import annotations

from typing import Any

from lmlab.models.config import TransformerConfig
from lmlab.models.families import BERT_TASK_HEADS, FamilySpec, Rule, stack_size
from lmlab.models.families.bert import (
    ENCODER_SHAPE,
    SIZE_FIELDS,
    bert_embedding_rules,
    layer_rules,
    mlm_rules,
)
from lmlab.utils.errors import LmlabError


def from_hf(hf: dict[str, Any], values: dict[str, Any]) -> None:
    if "hidden_dim" not in hf:
        values["intermediate_size"] = 4 * values["hidden_size"]
    values["position_embedding"] = "sinusoidal" if hf.get("sinusoidal_pos_embds") else "learned"


def to_hf(config: TransformerConfig, hf: dict[str, Any]) -> None:
    if config.position_embedding not in ("learned", "sinusoidal"):
        raise LmlabError(f"a DistilBERT checkpoint has learned or sinusoidal positions, not "
                         f"{config.position_embedding!r}", "save the model as family 'bert'")
    hf["sinusoidal_pos_embds"] = config.position_embedding == "sinusoidal"


def _base_rules(config: TransformerConfig) -> list[Rule]:
    """BERT's embedding names (its stored sinusoids fill lmlab's buffer), its own layer names."""
    return bert_embedding_rules(config) + layer_rules("transformer.layer.{i}.", (
        "attention.q_lin", "attention.k_lin", "attention.v_lin", "attention.out_lin",
        "sa_layer_norm", "ffn.lin1", "ffn.lin2", "output_layer_norm"))


FAMILY = FamilySpec(
    model_type="distilbert",
    display_name="DistilBERT",
    base_prefix="distilbert",
    # learned or sinusoidal positions (sinusoidal_pos_embds), so position_embedding is free
    shape={**{k: v for k, v in ENCODER_SHAPE.items() if k != "position_embedding"},
           "type_vocab_size": 0, "embedding_size": None, "norm_eps": 1e-12},
    defaults=dict(extra={"qa_dropout": 0.1, "seq_classif_dropout": 0.2}),
    sizes={"base": stack_size(768, 6)},
    hf_names={"vocab_size": "vocab_size", "dim": "hidden_size", "hidden_dim": "intermediate_size",
              "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
              "activation": "hidden_act", "dropout": "hidden_dropout_prob",
              "attention_dropout": "attention_probs_dropout_prob",
              "max_position_embeddings": "max_position_embeddings",
              "initializer_range": "initializer_range", "pad_token_id": "pad_token_id",
              "bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id",
              "tie_word_embeddings": "tie_word_embeddings", "qa_dropout": "extra.qa_dropout",
              "seq_classif_dropout": "extra.seq_classif_dropout"},
    hf_defaults={"extra": {}},  # the dropouts of the task heads only when config.json has them
    required=SIZE_FIELDS,
    from_hf=from_hf,
    to_hf=to_hf,
    base_rules=_base_rules,
    head_rules={
        "mlm": lambda config: mlm_rules("", transform="vocab_transform", norm="vocab_layer_norm",
                                        decoder="vocab_projector", bias=None,
                                        tied=config.tie_word_embeddings),
    },
    architectures={
        "DistilBertModel": (),
        "DistilBertForMaskedLM": ("mlm",),
    },
    task_heads={**BERT_TASK_HEADS, "sequence-classification": "pre-classifier",
                "multiple-choice": "pre-classifier"},
)
