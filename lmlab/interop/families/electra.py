"""ELECTRA (Clark et al. 2020): a BERT encoder trained as a replaced-token discriminator.

- Embeddings may be narrower than the stack (``embedding_size`` E < H, ELECTRA-Small):
  ``electra.embeddings_project`` (E -> H) is lmlab's ``Embeddings.projection``; it does not
  exist when E == H.
- ``ElectraForPreTraining`` is the discriminator: head ``discriminator_predictions.dense`` ->
  ``hidden_act`` -> ``dense_prediction`` (one logit per token) = lmlab's ``"rtd"`` head.
- ``ElectraForMaskedLM`` is the generator: ``generator_predictions`` (dense H -> E, exact GELU,
  LayerNorm on E) then ``generator_lm_head`` (E -> V, tied to the embeddings) = lmlab's
  ``"mlm"`` head with ``config.extra["mlm_head_act"] = "gelu"``.
- There is no pooler.
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


def config_from_hf(hf: dict[str, Any]) -> TransformerConfig:
    hidden = hf["hidden_size"]
    embedding = hf.get("embedding_size", hidden)
    return encoder_config_from_hf(
        hf, "electra",
        embedding_size=embedding if embedding != hidden else None,
        extra={"mlm_head_act": "gelu"},
    )


def config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    hf = encoder_config_to_hf(config, "electra")
    hf["embedding_size"] = config.input_embedding_size
    return hf


def _base_rules(config: TransformerConfig) -> list[Rule]:
    rules = bert_embedding_rules(config) + bert_layer_rules()
    if config.input_embedding_size != config.hidden_size:
        rules += [Rule(f"transformer.embeddings.projection.{p}", f"embeddings_project.{p}")
                  for p in ("weight", "bias")]
    return rules


FAMILY = FamilySpec(
    model_type="electra",
    base_prefix="electra",
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
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
)
