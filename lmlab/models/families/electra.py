"""ELECTRA (Clark et al. 2020): a BERT encoder, optionally with factorised embeddings; the
discriminator is the ``"rtd"`` head, the generator the ``"mlm"`` head (docs/models.md, which
also says where the generator presets' sizes come from).
"""

from __future__ import annotations

from typing import Any

from lmlab.models.families import BERT_TASK_HEADS, FamilySpec, paired_rules, stack_size
from lmlab.models.families.bert import (
    ENCODER_HF_NAMES,
    ENCODER_REQUIRED,
    ENCODER_SHAPE,
    bert_rules,
    check_absolute_positions,
    drop_equal_embedding_size,
    mlm_rules,
)


def from_hf(hf: dict[str, Any], values: dict[str, Any]) -> None:
    check_absolute_positions(hf, values)
    drop_equal_embedding_size(values)


FAMILY = FamilySpec(
    model_type="electra",
    display_name="ELECTRA",
    base_prefix="electra",
    shape=ENCODER_SHAPE,
    defaults=dict(extra={"mlm_head_act": "gelu"}),
    sizes={"small": stack_size(256, 12, embedding_size=128),
           "small-generator": stack_size(64, 12, embedding_size=128),
           "small-generator-released": stack_size(256, 12, embedding_size=128),
           "base": stack_size(768, 12), "base-generator": stack_size(256, 12, embedding_size=768)},
    hf_names={**ENCODER_HF_NAMES, "embedding_size": "embedding_size"},
    hf_constants={"position_embedding_type": "absolute"},
    required=ENCODER_REQUIRED,
    from_hf=from_hf,
    to_hf=lambda config, hf: hf.update(embedding_size=config.input_embedding_size),
    base_rules=bert_rules,
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
