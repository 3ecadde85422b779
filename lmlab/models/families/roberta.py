"""RoBERTa (Liu et al. 2019): BERT with fairseq's position numbering (from ``pad_token_id +
1``), one token type and an exact-GELU MLM head; what differs is tabled in docs/models.md."""

from __future__ import annotations

from typing import Any

from lmlab.models.config import TransformerConfig
from lmlab.models.families import BERT_TASK_HEADS, FamilySpec, paired_rules, stack_size
from lmlab.models.families.bert import (
    ENCODER_HF_NAMES,
    ENCODER_REQUIRED,
    ENCODER_SHAPE,
    bert_embedding_rules,
    bert_layer_rules,
    check_absolute_positions,
    mlm_rules,
)
from lmlab.utils.errors import LmlabError


def from_hf(hf: dict[str, Any], values: dict[str, Any]) -> None:
    if hf.get("is_decoder"):
        raise LmlabError("this RoBERTa checkpoint is a decoder (is_decoder: true)",
                         "lmlab reads RoBERTa as an encoder; use a checkpoint saved as an encoder")
    check_absolute_positions(hf, values)
    pad = values["pad_token_id"]
    values["position_offset"] = pad + 1 if pad is not None else 0


def to_hf(config: TransformerConfig, hf: dict[str, Any]) -> None:
    if config.pad_token_id is None or config.position_offset != config.pad_token_id + 1:
        raise LmlabError(
            f"a RoBERTa checkpoint numbers positions from pad_token_id + 1, but this config has "
            f"pad_token_id={config.pad_token_id}, position_offset={config.position_offset}",
            "set position_offset = pad_token_id + 1 (preset('roberta', ...) does)",
        )


FAMILY = FamilySpec(
    model_type="roberta",
    display_name="RoBERTa",
    base_prefix="roberta",
    shape=ENCODER_SHAPE,
    defaults=dict(vocab_size=50265, max_position_embeddings=514, position_offset=2,
                  type_vocab_size=1, norm_eps=1e-5, pad_token_id=1, bos_token_id=0,
                  eos_token_id=2, extra={"mlm_head_act": "gelu"}),
    sizes={"base": stack_size(768, 12), "large": stack_size(1024, 24)},
    hf_names=ENCODER_HF_NAMES,
    hf_defaults=dict(max_position_embeddings=512, norm_eps=1e-12),
    hf_constants={"position_embedding_type": "absolute"},
    required=ENCODER_REQUIRED,
    from_hf=from_hf,
    to_hf=to_hf,
    base_rules=lambda config: bert_embedding_rules(config) + bert_layer_rules(),
    # sequence classification has no pooler (classifier.dense -> tanh), multiple choice has one
    pooler_rules=paired_rules("", "", [("pooler.dense", "pooler.dense")], optional=True),
    head_rules={
        "mlm": lambda config: mlm_rules("lm_head.", transform="dense", norm="layer_norm",
                                        tied=config.tie_word_embeddings),
    },
    architectures={
        "RobertaModel": (),
        "RobertaForMaskedLM": ("mlm",),
    },
    task_heads={**BERT_TASK_HEADS, "sequence-classification": "dense-tanh"},
)
