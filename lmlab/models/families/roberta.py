"""RoBERTa (Liu et al. 2019): BERT's architecture, fairseq position numbering, no NSP.

Differences from BERT that the family carries:

- positions count from ``padding_idx + 1`` (fairseq): ``position_offset = pad_token_id + 1``, and
  ``max_position_embeddings`` (514 for the released models) includes those offset rows;
- one token type (``type_vocab_size = 1``), 50265 byte-level BPE tokens, LayerNorm eps 1e-5;
- the MLM head is ``lm_head.{dense, layer_norm, decoder, bias}`` and applies exact GELU whatever
  ``hidden_act`` says (``config.extra["mlm_head_act"] = "gelu"``);
- sequence classification reads ``<s>`` through ``classifier.dense`` -> tanh ->
  ``classifier.out_proj``, so ``RobertaForSequenceClassification`` has no pooler (the pooler is
  optional in checkpoints) while ``RobertaForMultipleChoice`` has one.

Presets base and large: BERT's shapes.
"""

from __future__ import annotations

from typing import Any

from lmlab.models.config import TransformerConfig
from lmlab.models.families import BERT_TASK_HEADS, FamilySpec, Rule
from lmlab.models.families.bert import (
    ENCODER_HF_NAMES,
    ENCODER_SHAPE,
    SIZE_FIELDS,
    bert_embedding_rules,
    bert_layer_rules,
    check_absolute_positions,
    encoder_size,
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
    sizes={"base": encoder_size(768, 12), "large": encoder_size(1024, 24)},
    hf_names=ENCODER_HF_NAMES,
    hf_defaults=dict(max_position_embeddings=512, norm_eps=1e-12),
    hf_constants={"position_embedding_type": "absolute"},
    required=(*SIZE_FIELDS, "intermediate_size"),
    from_hf=from_hf,
    to_hf=to_hf,
    base_rules=lambda config: bert_embedding_rules(config) + bert_layer_rules(),
    pooler_rules=[Rule("pooler.dense.weight", "pooler.dense.weight", optional=True),
                  Rule("pooler.dense.bias", "pooler.dense.bias", optional=True)],
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
