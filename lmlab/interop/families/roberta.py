"""RoBERTa (Liu et al. 2019): BERT's architecture, fairseq position numbering, no NSP.

Differences from BERT that the mapping carries:

- positions count from ``padding_idx + 1`` (fairseq): ``position_offset = pad_token_id + 1``, and
  ``max_position_embeddings`` (514 for the released models) includes those offset rows;
- one token type (``type_vocab_size = 1``);
- the MLM head is ``lm_head.{dense, layer_norm, decoder, bias}`` and applies exact GELU whatever
  ``hidden_act`` says (``config.extra["mlm_head_act"] = "gelu"``).
"""

from __future__ import annotations

from typing import Any

from lmlab.interop.families import FamilySpec, Rule
from lmlab.interop.families.bert import (
    bert_embedding_rules,
    bert_layer_rules,
    encoder_config_from_hf,
    encoder_config_to_hf,
    mlm_rules,
)
from lmlab.models.config import TransformerConfig
from lmlab.utils.errors import LmlabError


def config_from_hf(hf: dict[str, Any]) -> TransformerConfig:
    if hf.get("is_decoder"):
        raise LmlabError("this RoBERTa checkpoint is a decoder (is_decoder: true)",
                         "lmlab reads RoBERTa as an encoder; use a checkpoint saved as an encoder")
    pad = hf.get("pad_token_id", 1)
    return encoder_config_from_hf(
        hf, "roberta",
        pad_token_id=pad,
        bos_token_id=hf.get("bos_token_id", 0),
        eos_token_id=hf.get("eos_token_id", 2),
        type_vocab_size=hf.get("type_vocab_size", 1),
        position_offset=pad + 1 if pad is not None else 0,
        extra={"mlm_head_act": "gelu"},
    )


def config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    if config.pad_token_id is None or config.position_offset != config.pad_token_id + 1:
        raise LmlabError(
            f"a RoBERTa checkpoint numbers positions from pad_token_id + 1, but this config has "
            f"pad_token_id={config.pad_token_id}, position_offset={config.position_offset}",
            "set position_offset = pad_token_id + 1 (preset('roberta', ...) does)",
        )
    return encoder_config_to_hf(config, "roberta")


def _base_rules(config: TransformerConfig) -> list[Rule]:
    return bert_embedding_rules(config) + bert_layer_rules()


FAMILY = FamilySpec(
    model_type="roberta",
    base_prefix="roberta",
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    base_rules=_base_rules,
    pooler_rules=[Rule("pooler.dense.weight", "pooler.dense.weight"),
                  Rule("pooler.dense.bias", "pooler.dense.bias")],
    head_rules={
        "mlm": lambda config: mlm_rules("lm_head.", transform="dense", norm="layer_norm",
                                        tied=config.tie_word_embeddings),
    },
    architectures={
        "RobertaModel": (),
        "RobertaForMaskedLM": ("mlm",),
    },
)
