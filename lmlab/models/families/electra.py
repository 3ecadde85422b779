"""ELECTRA (Clark et al. 2020): a BERT encoder, optionally with factorised embeddings; the
discriminator is the ``"rtd"`` head, the generator the ``"mlm"`` head (docs/models.md, which
also says where the generator presets' sizes come from).
"""

from __future__ import annotations

from typing import Any

from lmlab.models.config import TransformerConfig
from lmlab.models.families import BERT_TASK_HEADS, FamilySpec, Rule, paired_rules
from lmlab.models.families.bert import (
    ENCODER_HF_NAMES,
    ENCODER_REQUIRED,
    ENCODER_SHAPE,
    bert_embedding_rules,
    bert_layer_rules,
    check_absolute_positions,
    drop_equal_embedding_size,
    mlm_rules,
    projection_rules,
)


def _size(hidden: int, heads: int, intermediate: int, embedding: int) -> dict[str, Any]:
    return dict(hidden_size=hidden, num_hidden_layers=12, num_attention_heads=heads,
                intermediate_size=intermediate,
                embedding_size=embedding if embedding != hidden else None)


def from_hf(hf: dict[str, Any], values: dict[str, Any]) -> None:
    check_absolute_positions(hf, values)
    drop_equal_embedding_size(values)


def _base_rules(config: TransformerConfig) -> list[Rule]:
    rules = bert_embedding_rules(config) + bert_layer_rules()
    if config.input_embedding_size != config.hidden_size:
        rules += projection_rules("embeddings_project")
    return rules


FAMILY = FamilySpec(
    model_type="electra",
    display_name="ELECTRA",
    base_prefix="electra",
    shape=ENCODER_SHAPE,
    defaults=dict(extra={"mlm_head_act": "gelu"}),
    sizes={"small": _size(256, 4, 1024, 128), "small-generator": _size(64, 1, 256, 128),
           "small-generator-released": _size(256, 4, 1024, 128),
           "base": _size(768, 12, 3072, 768), "base-generator": _size(256, 4, 1024, 768)},
    hf_names={**ENCODER_HF_NAMES, "embedding_size": "embedding_size"},
    hf_constants={"position_embedding_type": "absolute"},
    required=ENCODER_REQUIRED,
    from_hf=from_hf,
    to_hf=lambda config, hf: hf.update(embedding_size=config.input_embedding_size),
    base_rules=_base_rules,
    head_rules={
        "rtd": lambda config: paired_rules("heads.rtd.", "discriminator_predictions.", [
            ("dense", "dense"), ("dense_prediction", "dense_prediction")]),
        "mlm": lambda config: mlm_rules("", transform="generator_predictions.dense",
                                        norm="generator_predictions.LayerNorm",
                                        decoder="generator_lm_head", bias=None,
                                        tied=config.tie_word_embeddings),
    },
    architectures={
        "ElectraModel": (),
        "ElectraForPreTraining": ("rtd",),
        "ElectraForMaskedLM": ("mlm",),
    },
    task_heads={**BERT_TASK_HEADS, "sequence-classification": "dense-gelu",
                "multiple-choice": "summary"},
)
