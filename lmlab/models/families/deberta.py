"""DeBERTa v1 (He et al. 2021): DeBERTa-v2's disentangled attention without buckets, shared
maps or a normalised table; each layer's query/key/value in one ``in_proj`` (each head's rows in
turn, no bias) plus ``q_bias`` / ``v_bias``, keys unbiased (``extra["key_bias"]``: false), the
position maps ``pos_proj`` (c2p, no bias) and ``pos_q_proj`` (p2c); docs/deberta.md.
"""

from __future__ import annotations

from typing import Any

from lmlab.models.config import TransformerConfig
from lmlab.models.families import BERT_TASK_HEADS, FamilySpec, Rule, paired_rules, stack_size
from lmlab.models.families.bert import ENCODER_HF_NAMES, ENCODER_REQUIRED, bert_embedding_rules
from lmlab.models.families.deberta_v2 import (
    SHAPE,
    check_from_hf,
    check_to_hf,
    deberta_mlm_rules,
    emd_rules,
)
from lmlab.utils.errors import LmlabError

HF_NAMES = {**ENCODER_HF_NAMES, **{name: name for name in (
    "relative_attention", "pos_att_type", "max_relative_positions")},
    "pooler_hidden_act": "extra.classifier_act", "pooler_dropout": "extra.pooler_dropout",
    "cls_dropout": "extra.classifier_dropout", "legacy": "extra.legacy"}
_EXTRA = {"legacy": True, "classifier_act": "gelu", "pooler_dropout": 0, "key_bias": False}
#: what transformers' DebertaConfig assumes for an absent key
HF_DEFAULTS = dict(type_vocab_size=0, norm_eps=1e-7, relative_attention=False,
                   pos_att_type=None, position_embedding="learned", extra=_EXTRA)
#: microsoft/deberta-base's and -large's config.json values, sizes aside
DEFAULTS = dict(vocab_size=50265, type_vocab_size=0, norm_eps=1e-7, relative_attention=True,
                pos_att_type=["c2p", "p2c"], position_embedding="none", extra=_EXTRA)


def from_hf(hf: dict[str, Any], values: dict[str, Any]) -> None:
    check_from_hf(hf, values, "DeBERTa")
    if hf.get("talking_head"):
        raise LmlabError("this DeBERTa checkpoint mixes heads (talking_head: true)",
                         "lmlab builds DeBERTa without talking heads; load it with transformers")


def v1_rules(config: TransformerConfig) -> list[Rule]:
    """BERT's embeddings; per layer the fused ``in_proj`` with its two biases, BERT's output and
    feed-forward names, the position maps; the distance table."""
    layer, theirs = "transformer.layers.{i}.", "encoder.layer.{i}."
    rules = bert_embedding_rules(config) + [
        Rule(tuple(f"{layer}attention.{p}_proj.weight" for p in "qkv"),
             f"{theirs}attention.self.in_proj.weight", split=0, per_head=True),
        Rule(f"{layer}attention.q_proj.bias", f"{theirs}attention.self.q_bias"),
        Rule(f"{layer}attention.v_proj.bias", f"{theirs}attention.self.v_bias"),
        *paired_rules(layer, theirs, [
            ("attention.o_proj", "attention.output.dense"),
            ("attention_norm", "attention.output.LayerNorm"),
            ("feed_forward.up_proj", "intermediate.dense"),
            ("feed_forward.down_proj", "output.dense"), ("ffn_norm", "output.LayerNorm")])]
    if config.relative_attention:
        terms = config.pos_att_type or ()
        maps = f"{layer}attention.disentangled.", f"{theirs}attention.self."
        if "c2p" in terms:
            rules += paired_rules(*maps, [("pos_key_proj", "pos_proj")], params=("weight",))
        if "p2c" in terms:
            rules += paired_rules(*maps, [("pos_query_proj", "pos_q_proj")])
        rules.append(Rule("transformer.relative_positions.embeddings.weight",
                          "encoder.rel_embeddings.weight"))
    return rules


FAMILY = FamilySpec(
    model_type="deberta",
    display_name="DeBERTa",
    base_prefix="deberta",
    shape={**SHAPE, "position_buckets": -1, "share_att_key": False, "norm_rel_ebd": "none"},
    defaults=DEFAULTS,
    sizes={"base": stack_size(768, 12), "large": stack_size(1024, 24)},
    hf_names=HF_NAMES,
    hf_defaults=HF_DEFAULTS,
    required=ENCODER_REQUIRED,
    from_hf=from_hf,
    to_hf=lambda config, hf: check_to_hf(config, hf, key_bias=False),
    base_rules=v1_rules,
    head_rules={"mlm": deberta_mlm_rules, "emd": emd_rules},
    architectures={"DebertaModel": (), "DebertaForMaskedLM": ("mlm",)},
    saved_as={"emd": "mlm"},
    task_heads={head: layout for head, layout in BERT_TASK_HEADS.items()
                if head != "multiple-choice"} | {"sequence-classification": "context-pooler"},
)
