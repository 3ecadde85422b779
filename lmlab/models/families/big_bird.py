"""BigBird (Zaheer et al. 2020), transformers' ``big_bird``: BERT whose every layer attends in
BigBird's block-sparse pattern (``block_sparse``: global first and last blocks, a window of 3
blocks, random blocks; lmlab/models/core/block_sparse.py), dense for inputs too short for it.
"""

from __future__ import annotations

from typing import Any

from lmlab.models.config import TransformerConfig
from lmlab.models.families import FamilySpec, paired_rules, stack_size
from lmlab.models.families.bert import (
    ENCODER_HF_NAMES,
    ENCODER_REQUIRED,
    ENCODER_SHAPE,
    bert_embedding_rules,
    bert_layer_rules,
    mlm_rules,
)
from lmlab.utils.errors import LmlabError

_ATTENTION_TYPES = ("block_sparse", "original_full")


def from_hf(hf: dict[str, Any], values: dict[str, Any]) -> None:
    """The attention type as ``block_sparse`` (None: ``original_full``); the activation of the
    classification head (the model's own); decoders refused."""
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        raise LmlabError("this BigBird checkpoint is a decoder (is_decoder: true)",
                         "lmlab reads BigBird as an encoder; use a checkpoint saved as one")
    kind = hf.get("attention_type", "block_sparse")
    if kind not in _ATTENTION_TYPES:
        raise LmlabError(f"BigBird attention_type {kind!r} is not known",
                         f"use one of {', '.join(_ATTENTION_TYPES)}")
    values["block_sparse"] = None if kind == "original_full" else {
        "block_size": hf.get("block_size", 64), "num_random_blocks": hf.get("num_random_blocks", 3)}
    values.setdefault("extra", {})["classifier_act"] = values["hidden_act"]


def to_hf(config: TransformerConfig, hf: dict[str, Any]) -> None:
    """``attention_type``, ``block_size`` and ``num_random_blocks`` from ``block_sparse``."""
    act = config.extra.get("classifier_act", "gelu_new")
    if act != config.hidden_act:
        raise LmlabError(f"BigBird's classification head applies hidden_act "
                         f"({config.hidden_act}), this model's applies {act}",
                         f"set extra['classifier_act'] = {config.hidden_act!r}")
    hf["attention_type"] = "block_sparse" if config.block_sparse else "original_full"
    hf.update(config.block_sparse or {})


FAMILY = FamilySpec(
    model_type="big_bird",
    display_name="BigBird",
    base_prefix="bert",
    # the output map is always biased; use_bias is the q, k, v maps'
    shape={**{k: v for k, v in ENCODER_SHAPE.items() if k != "attention_bias"},
           "attention_out_bias": True},
    defaults=dict(vocab_size=50358, max_position_embeddings=4096, hidden_act="gelu_new",
                  pad_token_id=0, bos_token_id=1, eos_token_id=2,
                  block_sparse={"block_size": 64, "num_random_blocks": 3},
                  extra={"classifier_act": "gelu_new", "sep_token_id": 66}),
    sizes={"tiny": stack_size(128, 2, block_sparse={"block_size": 16, "num_random_blocks": 1}),
           "base": stack_size(768, 12), "large": stack_size(1024, 24)},
    hf_names={**ENCODER_HF_NAMES, "use_bias": "attention_bias",
              "rescale_embeddings": "scale_embedding", "sep_token_id": "extra.sep_token_id"},
    required=ENCODER_REQUIRED,
    from_hf=from_hf,
    to_hf=to_hf,
    base_rules=lambda config: bert_embedding_rules(config) + bert_layer_rules(),
    # BigBirdModel's pooler is one Linear; its task classes all hold it, the MLM class too
    pooler_rules=paired_rules("", "", [("pooler.dense", "pooler")], optional=True),
    head_rules={"mlm": lambda config: mlm_rules("cls.predictions.",
                                                tied=config.tie_word_embeddings)},
    architectures={"BigBirdModel": (), "BigBirdForMaskedLM": ("mlm",)},
    # [CLS] -> dense -> hidden_act -> out_proj; multiple choice reads the pooler; QA is its
    # qa_classifier (span-ffn), which leaves the question out of the answer's logits
    task_heads={"sequence-classification": "dense-gelu", "multiple-choice": "pooler",
                "token-classification": "tokens", "question-answering": "span-ffn"},
    keeps_pooler=("token-classification",),  # BigBirdForTokenClassification holds one
)
