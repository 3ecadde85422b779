"""ELECTRA (Clark et al. 2020): a BERT encoder trained as a replaced-token discriminator.

- Embeddings may be narrower than the stack (``embedding_size`` E < H, ELECTRA-Small):
  ``electra.embeddings_project`` (E -> H) is lmlab's ``Embeddings.projection``; it does not
  exist when E == H.
- ``ElectraForPreTraining`` is the discriminator: head ``discriminator_predictions.dense`` ->
  ``hidden_act`` -> ``dense_prediction`` (one logit per token) = lmlab's ``"rtd"`` head.
- ``ElectraForMaskedLM`` is the generator: ``generator_predictions`` (dense H -> E, exact GELU,
  LayerNorm on E) then ``generator_lm_head`` (E -> V, tied to the embeddings) = lmlab's
  ``"mlm"`` head with ``config.extra["mlm_head_act"] = "gelu"``.
- There is no pooler: sequence classification reads ``[CLS]`` through ``classifier.dense`` ->
  GELU -> ``classifier.out_proj``, multiple choice through ``sequence_summary``.

Presets: the small / base discriminators and their generators. Generator sizes follow the
paper's multipliers of hidden size, FFN size and head count (1/4 for Small, 1/3 for Base;
Table 7). Note: the *released* google/electra-small-generator is full size (H256, 4 heads,
FF1024); ``"small-generator-released"`` is that one.
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
    mlm_rules,
)


def _size(hidden: int, heads: int, intermediate: int, embedding: int) -> dict[str, Any]:
    return dict(hidden_size=hidden, num_hidden_layers=12, num_attention_heads=heads,
                intermediate_size=intermediate,
                embedding_size=embedding if embedding != hidden else None)


def from_hf(hf: dict[str, Any], values: dict[str, Any]) -> None:
    check_absolute_positions(hf, values)
    if values.get("embedding_size") == values["hidden_size"]:
        values["embedding_size"] = None


def _base_rules(config: TransformerConfig) -> list[Rule]:
    rules = bert_embedding_rules(config) + bert_layer_rules()
    if config.input_embedding_size != config.hidden_size:
        rules += [Rule(f"transformer.embeddings.projection.{p}", f"embeddings_project.{p}")
                  for p in ("weight", "bias")]
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
    required=(*SIZE_FIELDS, "intermediate_size"),
    from_hf=from_hf,
    to_hf=lambda config, hf: hf.update(embedding_size=config.input_embedding_size),
    base_rules=_base_rules,
    head_rules={
        "rtd": lambda config: [
            Rule(f"heads.rtd.{ours}.{p}", f"discriminator_predictions.{theirs}.{p}")
            for ours, theirs in (("dense", "dense"), ("dense_prediction", "dense_prediction"))
            for p in ("weight", "bias")
        ],
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
