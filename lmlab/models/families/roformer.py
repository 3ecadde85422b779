"""RoFormer (Su et al. 2021): BERT with rotary positions instead of a learned table.

Its query/key rows are stored for adjacent-pair rotation (``Rule.rotary_pairs`` permutes them)
and its fixed sinusoid table is written, not read; heads as ELECTRA's (docs/models.md).
"""

from __future__ import annotations

from typing import Any

from lmlab.models.config import TransformerConfig
from lmlab.models.families import BERT_TASK_HEADS, FamilySpec
from lmlab.models.families.bert import (
    BERT_SIZES,
    ENCODER_HF_NAMES,
    ENCODER_REQUIRED,
    ENCODER_SHAPE,
    bert_rules,
    drop_equal_embedding_size,
    mlm_rules,
)
from lmlab.utils.errors import LmlabError


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
    drop_equal_embedding_size(values)


FAMILY = FamilySpec(
    model_type="roformer",
    display_name="RoFormer",
    base_prefix="roformer",
    shape={**ENCODER_SHAPE, "position_embedding": "rotary"},
    sizes=BERT_SIZES,
    hf_names={**ENCODER_HF_NAMES, "embedding_size": "embedding_size"},
    # RoFormerConfig has no summary settings, so transformers' RoFormerForMultipleChoice would
    # read the *last* position, unprojected; written out, they give ELECTRA's summary instead
    hf_constants={"rotary_value": False, "summary_type": "first", "summary_use_proj": True,
                  "summary_last_dropout": 0.1},
    defaults=dict(extra={"summary_activation": "gelu", "summary_last_dropout": 0.1}),
    required=ENCODER_REQUIRED,
    from_hf=from_hf,
    to_hf=lambda config, hf: hf.update(embedding_size=config.input_embedding_size),
    base_rules=bert_rules,
    head_rules={"mlm": lambda config: mlm_rules("cls.predictions.",
                                                tied=config.tie_word_embeddings)},
    architectures={"RoFormerModel": (), "RoFormerForMaskedLM": ("mlm",)},
    task_heads={**BERT_TASK_HEADS, "sequence-classification": "dense-gelu",
                "multiple-choice": "summary"},
    fixed_tensors=position_table,
)
