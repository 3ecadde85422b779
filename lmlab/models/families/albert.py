"""ALBERT (Lan et al. 2020): factorised embeddings, one layer shared by the whole stack, SOP
(docs/models.md). Presets: BERT's shapes with E = 128, ``gelu_new`` and no dropout.
"""

from __future__ import annotations

from typing import Any

from lmlab.models.config import TransformerConfig
from lmlab.models.families import BERT_TASK_HEADS, FamilySpec, Rule, paired_rules, stack_size
from lmlab.models.families.bert import (
    ENCODER_HF_NAMES,
    ENCODER_REQUIRED,
    ENCODER_SHAPE,
    bert_embedding_rules,
    check_absolute_positions,
    layer_rules,
    mlm_rules,
    projection_rules,
)
from lmlab.utils.errors import LmlabError


def from_hf(hf: dict[str, Any], values: dict[str, Any]) -> None:
    groups, inner = hf.get("num_hidden_groups", 1), hf.get("inner_group_num", 1)
    if groups != 1 or inner != 1:
        raise LmlabError(
            f"this ALBERT checkpoint has num_hidden_groups={groups}, inner_group_num={inner}; "
            "lmlab supports one shared layer (both 1), as in every released ALBERT",
            "use a checkpoint with num_hidden_groups = inner_group_num = 1",
        )
    check_absolute_positions(hf, values)


def to_hf(config: TransformerConfig, hf: dict[str, Any]) -> None:
    hf.update(embedding_size=config.input_embedding_size, num_hidden_groups=1, inner_group_num=1,
              classifier_dropout_prob=config.extra.get("classifier_dropout_prob", 0.1))


def _base_rules(config: TransformerConfig) -> list[Rule]:
    rules = bert_embedding_rules(config)
    if config.input_embedding_size != config.hidden_size:
        rules += projection_rules("encoder.embedding_hidden_mapping_in")
    return rules + layer_rules("encoder.albert_layer_groups.0.albert_layers.0.", (
        "attention.query", "attention.key", "attention.value", "attention.dense",
        "attention.LayerNorm", "ffn", "ffn_output", "full_layer_layer_norm"),
        layer="transformer.layers.0.")


FAMILY = FamilySpec(
    model_type="albert",
    display_name="ALBERT",
    base_prefix="albert",
    shape={**ENCODER_SHAPE, "share_layers": True},
    defaults=dict(vocab_size=30000, embedding_size=128, hidden_act="gelu_new",
                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, bos_token_id=2,
                  eos_token_id=3),
    sizes={"base": stack_size(768, 12), "large": stack_size(1024, 24)},
    hf_names={**ENCODER_HF_NAMES, "embedding_size": "embedding_size"},
    hf_constants={"position_embedding_type": "absolute"},
    required=ENCODER_REQUIRED,
    from_hf=from_hf,
    to_hf=to_hf,
    base_rules=_base_rules,
    pooler_rules=paired_rules("", "", [("pooler.dense", "pooler")]),
    head_rules={
        "mlm": lambda config: mlm_rules("predictions.", transform="dense", norm="LayerNorm",
                                        tied=config.tie_word_embeddings),
        "sop": lambda config: paired_rules("heads.sop.", "sop_classifier.",
                                           [("classifier", "classifier")]),
    },
    architectures={
        "AlbertModel": (),
        "AlbertForMaskedLM": ("mlm",),
        "AlbertForPreTraining": ("mlm", "sop"),
    },
    task_heads=BERT_TASK_HEADS,
)
