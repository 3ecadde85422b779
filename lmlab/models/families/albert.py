"""ALBERT (Lan et al. 2020): factorised embeddings, one layer shared by the whole stack, SOP.

- Tokens are embedded at width ``embedding_size`` E (LayerNorm on E), then
  ``encoder.embedding_hidden_mapping_in`` (E -> H) projects them: lmlab's
  ``Embeddings.projection``.
- Every layer reuses the weights of ``albert_layer_groups.0.albert_layers.0``
  (``share_layers=True``). Checkpoints with several layer groups or several inner layers per
  group (``num_hidden_groups > 1``, ``inner_group_num > 1``) are rejected: the released models
  use one of each.
- The MLM head narrows H -> E (``predictions.dense``) so the decoder shares the E-wide embedding
  matrix; the SOP head reads the pooled [CLS] vector (``albert.pooler`` + tanh).

Presets base and large: BERT's shapes with E = 128, ``gelu_new`` and no dropout.
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
    check_absolute_positions,
    encoder_size,
    mlm_rules,
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


_LAYER = "encoder.albert_layer_groups.0.albert_layers.0."


def _base_rules(config: TransformerConfig) -> list[Rule]:
    rules = bert_embedding_rules(config)
    if config.input_embedding_size != config.hidden_size:
        rules += [Rule(f"transformer.embeddings.projection.{p}",
                       f"encoder.embedding_hidden_mapping_in.{p}") for p in ("weight", "bias")]
    pairs = [
        ("attention.q_proj", "attention.query"),
        ("attention.k_proj", "attention.key"),
        ("attention.v_proj", "attention.value"),
        ("attention.o_proj", "attention.dense"),
        ("attention_norm", "attention.LayerNorm"),
        ("feed_forward.up_proj", "ffn"),
        ("feed_forward.down_proj", "ffn_output"),
        ("ffn_norm", "full_layer_layer_norm"),
    ]
    rules += [Rule(f"transformer.layers.0.{a}.{p}", f"{_LAYER}{b}.{p}")
              for a, b in pairs for p in ("weight", "bias")]
    return rules


FAMILY = FamilySpec(
    model_type="albert",
    display_name="ALBERT",
    base_prefix="albert",
    shape={**ENCODER_SHAPE, "share_layers": True},
    defaults=dict(vocab_size=30000, embedding_size=128, hidden_act="gelu_new",
                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, bos_token_id=2,
                  eos_token_id=3),
    sizes={"base": encoder_size(768, 12), "large": encoder_size(1024, 24)},
    hf_names={**ENCODER_HF_NAMES, "embedding_size": "embedding_size"},
    hf_constants={"position_embedding_type": "absolute"},
    required=(*SIZE_FIELDS, "intermediate_size"),
    from_hf=from_hf,
    to_hf=to_hf,
    base_rules=_base_rules,
    pooler_rules=[Rule("pooler.dense.weight", "pooler.weight"),
                  Rule("pooler.dense.bias", "pooler.bias")],
    head_rules={
        "mlm": lambda config: mlm_rules("predictions.", transform="dense", norm="LayerNorm",
                                        tied=config.tie_word_embeddings),
        "sop": lambda config: [
            Rule("heads.sop.classifier.weight", "sop_classifier.classifier.weight"),
            Rule("heads.sop.classifier.bias", "sop_classifier.classifier.bias"),
        ],
    },
    architectures={
        "AlbertModel": (),
        "AlbertForMaskedLM": ("mlm",),
        "AlbertForPreTraining": ("mlm", "sop"),
    },
    task_heads=BERT_TASK_HEADS,
)
