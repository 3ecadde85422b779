"""Longformer (Beltagy et al. 2020): RoBERTa whose every layer attends in a sliding window
(``attention_window``, per layer) with global tokens (``global_attention_mask``) that have their
own q, k, v maps (``query_global``, ``key_global``, ``value_global``; docs/long-attention.md).
"""

from __future__ import annotations

from typing import Any

from lmlab.models.config import TransformerConfig
from lmlab.models.families import (
    BERT_TASK_HEADS,
    FamilySpec,
    Rule,
    paired_rules,
    stack_size,
)
from lmlab.models.families import roberta as _roberta
from lmlab.models.families.bert import (
    ENCODER_HF_NAMES,
    ENCODER_REQUIRED,
    ENCODER_SHAPE,
    bert_embedding_rules,
    bert_layer_rules,
    mlm_rules,
)
from lmlab.utils.errors import LmlabError


def to_hf(config: TransformerConfig, hf: dict[str, Any]) -> None:
    _roberta.to_hf(config, hf)
    windows = [config.layer_window(i) for i in range(config.num_hidden_layers)]
    if not all(windows) or not config.extra.get("global_projections"):
        raise LmlabError("a Longformer windows every layer and maps its global tokens with "
                         "their own projections", "build it from family_config('longformer')")


def _base_rules(config: TransformerConfig) -> list[Rule]:
    maps = [(f"attention.global_proj.{n}", f"attention.self.{p}_global")
            for n, p in enumerate(("query", "key", "value"))]
    return (bert_embedding_rules(config) + bert_layer_rules()
            + paired_rules("transformer.layers.{i}.", "encoder.layer.{i}.", maps))


FAMILY = FamilySpec(
    model_type="longformer",
    display_name="Longformer",
    base_prefix="longformer",
    shape=ENCODER_SHAPE,
    defaults=dict(vocab_size=50265, max_position_embeddings=4098, position_offset=2,
                  type_vocab_size=1, norm_eps=1e-5, pad_token_id=1, bos_token_id=0,
                  eos_token_id=2, attention_window=512,
                  extra={"mlm_head_act": "gelu", "global_projections": True,
                         "sep_token_id": 2}),
    sizes={"tiny": stack_size(128, 2, attention_window=32),  # CPU runs
           "base": stack_size(768, 12), "large": stack_size(1024, 24)},
    hf_names={**ENCODER_HF_NAMES, "attention_window": "attention_window",
              "sep_token_id": "extra.sep_token_id"},
    hf_defaults=dict(max_position_embeddings=512, norm_eps=1e-12, type_vocab_size=2),
    required=ENCODER_REQUIRED,
    from_hf=_roberta.from_hf,
    to_hf=to_hf,
    base_rules=_base_rules,
    pooler_rules=paired_rules("", "", [("pooler.dense", "pooler.dense")], optional=True),
    head_rules={"mlm": lambda config: mlm_rules("lm_head.", transform="dense", norm="layer_norm",
                                                tied=config.tie_word_embeddings)},
    architectures={"LongformerModel": (), "LongformerForMaskedLM": ("mlm",)},
    task_heads={**BERT_TASK_HEADS, "sequence-classification": "dense-tanh"},
    # what transformers' task classes make global when given no global_attention_mask
    global_tokens={"sequence-classification": "first", "question-answering": "before-sep",
                   "multiple-choice": "after-sep"},
)
