"""RoFormer (Su et al. 2021, "RoFormer: enhanced transformer with rotary position embedding"):
BERT with rotary position embeddings instead of a learned position table.

Everything else is BERT's: post-norm layers, segment embeddings and an embedding LayerNorm, the
same layer and masked-LM names (under ``roformer.``), no pooler. Two real differences:

- RoFormer rotates adjacent pairs of each head's query and key dimensions (2i, 2i+1); lmlab's
  core rotates halves (i, i + head_dim/2) as Llama does. The two are the same attention up to
  a permutation of the query/key projection rows, which the mapping applies
  (``Rule.rotary_pairs``), so a checkpoint loads with identical outputs.
- ``roformer.encoder.embed_positions.weight`` holds the sinusoid table the rotation reads
  (sin of every pair's angle, then cos). It is not learned: lmlab computes the angles itself,
  skips the table on load and writes it on save, where transformers expects it.

Sequence classification reads ``[CLS]`` through ``classifier.dense`` -> the model's
``hidden_act`` (``extra["classifier_act"]`` when it is not GELU) -> ``classifier.out_proj``,
as ELECTRA does with a fixed GELU; multiple choice through ``sequence_summary`` with
ELECTRA's settings, which lmlab writes into config.json (transformers' RoFormer has none and
would summarise by the last position).
Presets: BERT's sizes (Turc et al. 2019 and Devlin et al. 2019) with rotary positions.
"""

from __future__ import annotations

from typing import Any

from lmlab.models.config import TransformerConfig
from lmlab.models.families import BERT_TASK_HEADS, FamilySpec, Rule
from lmlab.models.families.bert import (
    ENCODER_HF_NAMES,
    ENCODER_SHAPE,
    SIZE_FIELDS,
    bert_layer_rules,
    encoder_size,
    mlm_rules,
)
from lmlab.utils.errors import LmlabError

ROTATED = ("attention.self.query.", "attention.self.key.")  # rows stored as rotation pairs


def _layer_rules() -> list[Rule]:
    from dataclasses import replace

    return [replace(rule, rotary_pairs=any(name in rule.theirs for name in ROTATED))
            for rule in bert_layer_rules()]


def _base_rules(config: TransformerConfig) -> list[Rule]:
    rules = [
        Rule("transformer.embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight"),
        Rule("transformer.embeddings.norm.weight", "embeddings.LayerNorm.weight"),
        Rule("transformer.embeddings.norm.bias", "embeddings.LayerNorm.bias"),
    ]
    if config.type_vocab_size > 0:
        rules.append(Rule("transformer.embeddings.token_type_embeddings.weight",
                          "embeddings.token_type_embeddings.weight"))
    if config.input_embedding_size != config.hidden_size:
        rules += [Rule(f"transformer.embeddings.projection.{p}", f"embeddings_project.{p}")
                  for p in ("weight", "bias")]
    return rules + _layer_rules()


def position_table(config: TransformerConfig) -> dict[str, Any]:
    """RoFormer's stored sinusoid table: (max_position_embeddings, head_dim), the sines of
    every pair's angle in the first half, the cosines in the second."""
    import torch  # here, not at import: listing the families must not load torch

    from lmlab.models.core.positions import sinusoidal_table

    table = sinusoidal_table(config.max_position_embeddings, config.head_dim)  # sin, cos, ...
    return {"encoder.embed_positions.weight": torch.cat([table[:, 0::2], table[:, 1::2]], 1)}


def from_hf(hf: dict[str, Any], values: dict[str, Any]) -> None:
    """Refuse rotated values; record the activation RoFormer's classification head applies."""
    if values.get("hidden_act", "gelu") != "gelu":
        values.setdefault("extra", {})["classifier_act"] = values["hidden_act"]
    if hf.get("rotary_value"):
        raise LmlabError("this RoFormer rotates the attention values too (rotary_value: true)",
                         "lmlab reads RoFormer checkpoints that rotate queries and keys only")
    if values.get("embedding_size") == values["hidden_size"]:
        values["embedding_size"] = None


FAMILY = FamilySpec(
    model_type="roformer",
    display_name="RoFormer",
    base_prefix="roformer",
    shape={**ENCODER_SHAPE, "position_embedding": "rotary"},
    sizes={size: encoder_size(hidden, layers) for size, (hidden, layers) in {
        "tiny": (128, 2), "mini": (256, 4), "small": (512, 4), "medium": (512, 8),
        "base": (768, 12), "large": (1024, 24)}.items()},
    hf_names={**ENCODER_HF_NAMES, "embedding_size": "embedding_size"},
    # RoFormerConfig has no summary settings, so transformers' RoFormerForMultipleChoice would
    # read the *last* position, unprojected; written out, they give ELECTRA's summary instead
    hf_constants={"rotary_value": False, "summary_type": "first", "summary_use_proj": True,
                  "summary_last_dropout": 0.1},
    defaults=dict(extra={"summary_activation": "gelu", "summary_last_dropout": 0.1}),
    required=(*SIZE_FIELDS, "intermediate_size"),
    from_hf=from_hf,
    to_hf=lambda config, hf: hf.update(embedding_size=config.input_embedding_size),
    base_rules=_base_rules,
    head_rules={"mlm": lambda config: mlm_rules("cls.predictions.",
                                                tied=config.tie_word_embeddings)},
    architectures={"RoFormerModel": (), "RoFormerForMaskedLM": ("mlm",)},
    task_heads={**BERT_TASK_HEADS, "sequence-classification": "dense-gelu",
                "multiple-choice": "summary"},
    fixed_tensors=position_table,
)
