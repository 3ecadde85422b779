"""DeBERTa-v2/v3 (He et al. 2021, 2023): BERT's post-norm encoder with disentangled attention
(:mod:`lmlab.models.core.disentangled`), no absolute positions at the input
(``position_biased_input`` false), log-bucketed relative distances; docs/deberta.md.

Not here: the convolution after the first layer (``conv_kernel_size``, deberta-v2-xlarge/xxlarge:
refused). The enhanced mask decoder is the ``emd`` head (:mod:`lmlab.models.mask_decoder`),
written as the MLM class plus the absolute table microsoft's checkpoints hold and transformers
ignores.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from lmlab.models.config import TransformerConfig
from lmlab.models.families import BERT_TASK_HEADS, FamilySpec, Rule, paired_rules, stack_size
from lmlab.models.families.bert import (
    ENCODER_HF_NAMES,
    ENCODER_REQUIRED,
    bert_embedding_rules,
    layer_rules,
    mlm_rules,
)
from lmlab.utils.errors import LmlabError

#: post-norm encoder, biases everywhere; positions are read from / written as position_biased_input
SHAPE: dict[str, Any] = dict(
    norm_type="layernorm", pre_norm=False, embedding_norm=True, final_norm=False, ffn_type="mlp",
    causal=False, attention_bias=True, mlp_bias=True, position_offset=0, scale_embedding=False,
    embedding_size=None, attention_scale=None)
HF_NAMES = {**ENCODER_HF_NAMES, **{name: name for name in (
    "relative_attention", "pos_att_type", "max_relative_positions", "position_buckets",
    "share_att_key", "norm_rel_ebd")}, "pooler_hidden_act": "extra.classifier_act",
    "pooler_dropout": "extra.pooler_dropout", "cls_dropout": "extra.classifier_dropout",
    "legacy": "extra.legacy"}
#: what transformers' DebertaV2Config assumes for an absent key
HF_DEFAULTS = dict(type_vocab_size=0, norm_eps=1e-7, relative_attention=False,
                   pos_att_type=None, position_buckets=-1, share_att_key=False,
                   norm_rel_ebd="none", position_embedding="learned",
                   extra={"legacy": True, "classifier_act": "gelu", "pooler_dropout": 0})
#: microsoft/deberta-v3-*'s config.json values, sizes aside
V3_DEFAULTS = dict(vocab_size=128100, type_vocab_size=0, norm_eps=1e-7, relative_attention=True,
                   pos_att_type=["p2c", "c2p"], position_buckets=256, share_att_key=True,
                   norm_rel_ebd="layer_norm", position_embedding="none",
                   extra={"legacy": True, "classifier_act": "gelu", "pooler_dropout": 0})


def check_from_hf(hf: dict[str, Any], values: dict[str, Any], what: str = "DeBERTa-v2") -> None:
    """Positions at the input or not; ``pos_att_type`` as a list; what lmlab does not build
    refused (the first-layer convolution, factorised embeddings, another pooler width)."""
    values["position_embedding"] = "learned" if hf.get("position_biased_input", True) else "none"
    kinds = values.get("pos_att_type")
    if isinstance(kinds, str):  # "p2c|c2p", as microsoft's config.json files write it
        values["pos_att_type"] = [k.strip() for k in kinds.lower().split("|") if k.strip()]
    if hf.get("conv_kernel_size", 0) > 0:
        raise LmlabError(f"this {what} checkpoint has a convolution after its first layer "
                         f"(conv_kernel_size {hf['conv_kernel_size']}, deberta-v2-xlarge's)",
                         "lmlab builds DeBERTa-v3 and v2 without it; load it with transformers")
    hidden = values["hidden_size"]
    for key in ("embedding_size", "pooler_hidden_size"):
        if hf.get(key) not in (None, hidden):
            raise LmlabError(f"this {what} checkpoint has {key} {hf[key]} != hidden_size {hidden}",
                             f"lmlab builds {what} with {key} equal to the hidden size")


def check_to_hf(config: TransformerConfig, hf: dict[str, Any], key_bias: bool = True) -> None:
    """``position_biased_input`` from the position kind; a non-legacy MLM head must be tied;
    keys biased (v2) or not (v1) as the family's checkpoints are."""
    if config.extra.get("key_bias", True) != key_bias:
        raise LmlabError(f"this DeBERTa config has key_bias {not key_bias}, its checkpoints "
                         f"{key_bias}", "save v1 (unbiased keys) as deberta, v2 as deberta-v2")
    if config.position_embedding not in ("learned", "none"):
        raise LmlabError(f"DeBERTa has learned or no input positions, not "
                         f"{config.position_embedding!r}", "build it from a DeBERTa preset")
    hf["position_biased_input"] = config.position_embedding == "learned"
    if not config.extra.get("legacy", True) and not config.tie_word_embeddings:
        raise LmlabError("DeBERTa's non-legacy MLM head always reads the token table",
                         "keep tie_word_embeddings true, or set extra['legacy'] true")


def deberta_mlm_rules(config: TransformerConfig) -> list[Rule]:
    """The legacy head (BERT's ``cls.predictions``) or v2's ``lm_predictions.lm_head`` (tied)."""
    if config.extra.get("legacy", True):
        return mlm_rules("cls.predictions.", tied=config.tie_word_embeddings)
    return mlm_rules("lm_predictions.lm_head.", transform="dense", norm="LayerNorm")


def emd_rules(config: TransformerConfig) -> list[Rule]:
    """The ``emd`` head: the MLM head's names and the absolute table
    (``deberta.embeddings.position_embeddings``, which transformers skips on loading)."""
    rules = [replace(rule, ours=rule.ours.replace("heads.mlm.", "heads.emd."))
             for rule in deberta_mlm_rules(config)]
    return rules + [Rule("heads.emd.position_embeddings.weight",
                         "deberta.embeddings.position_embeddings.weight")]


def relative_rules(config: TransformerConfig, layer_names: tuple[str, ...],
                   pos_names: dict[str, str]) -> list[Rule]:
    """Layers (``layer_names`` in :data:`~lmlab.models.families.bert.LAYER_MODULES` order), the
    per-layer position maps (``pos_names``: ours -> theirs) and the distance table."""
    rules = layer_rules("encoder.layer.{i}.", layer_names)
    if not config.relative_attention:
        return rules
    if not config.share_att_key:
        rules += paired_rules("transformer.layers.{i}.attention.disentangled.",
                              "encoder.layer.{i}.attention.self.",
                              [(ours, pos_names[ours]) for term, ours in
                               (("c2p", "pos_key_proj"), ("p2c", "pos_query_proj"))
                               if term in (config.pos_att_type or ())])
    rules.append(Rule("transformer.relative_positions.embeddings.weight",
                      "encoder.rel_embeddings.weight"))
    if "layer_norm" in config.norm_rel_ebd:
        rules += paired_rules("transformer.relative_positions.", "encoder.",
                              [("norm", "LayerNorm")])
    return rules


def unused_table_norm(config: TransformerConfig) -> dict[str, Any]:
    """The distance-table norm transformers builds (and never uses) without relative attention:
    written as initialised, not read."""
    if config.relative_attention or "layer_norm" not in config.norm_rel_ebd:
        return {}
    import torch  # family specs load without torch (`lmlab --help`)

    return {"encoder.LayerNorm.weight": torch.ones(config.hidden_size),
            "encoder.LayerNorm.bias": torch.zeros(config.hidden_size)}


V2_LAYER = ("attention.self.query_proj", "attention.self.key_proj", "attention.self.value_proj",
            "attention.output.dense", "attention.output.LayerNorm", "intermediate.dense",
            "output.dense", "output.LayerNorm")

FAMILY = FamilySpec(
    model_type="deberta-v2",
    display_name="DeBERTa-v2/v3",
    base_prefix="deberta",
    shape=SHAPE,
    defaults=V3_DEFAULTS,
    sizes={"xsmall": stack_size(384, 12), "small": stack_size(768, 6),
           "base": stack_size(768, 12), "large": stack_size(1024, 24)},
    hf_names=HF_NAMES,
    hf_defaults=HF_DEFAULTS,
    required=ENCODER_REQUIRED,
    from_hf=check_from_hf,
    to_hf=check_to_hf,
    base_rules=lambda config: bert_embedding_rules(config) + relative_rules(
        config, V2_LAYER, {"pos_key_proj": "pos_key_proj", "pos_query_proj": "pos_query_proj"}),
    head_rules={"mlm": deberta_mlm_rules, "emd": emd_rules},
    fixed_tensors=unused_table_norm,
    architectures={"DebertaV2Model": (), "DebertaV2ForMaskedLM": ("mlm",)},
    saved_as={"emd": "mlm"},
    task_heads={**BERT_TASK_HEADS, "sequence-classification": "context-pooler",
                "multiple-choice": "context-pooler"},
)
