"""ViT (Dosovitskiy et al. 2021): a pre-norm LayerNorm encoder with biases and a GELU MLP over
image patches (core/image_embeddings.py), a final norm, [CLS] classified (docs/vision.md).

Presets: DeiT's tiny and small (Touvron et al. 2021) and ViT-Base, patches of 16 on 224 pixels.
"""

from __future__ import annotations

from typing import Any

from lmlab.models.config import TransformerConfig
from lmlab.models.families import FamilySpec, Rule, paired_rules, stack_size
from lmlab.models.families.bert import LAYER_MODULES
from lmlab.utils.errors import LmlabError

IMAGE_CLASSIFICATION = "image-classification"  # the head (lmlab/models/image_head.py)


def from_hf(hf: dict[str, Any], values: dict[str, Any]) -> None:
    """Refuse what lmlab's attention and pooler cannot express."""
    if hf.get("qkv_bias", True) is False:
        raise LmlabError("ViT option qkv_bias=false is not supported",
                         "use a checkpoint whose query, key and value maps have biases")
    if hf.get("pooler_act", "tanh") != "tanh" or \
            hf.get("pooler_output_size") not in (None, values["hidden_size"]):
        raise LmlabError("this ViT's pooler is not tanh over hidden_size outputs",
                         "use a checkpoint with pooler_act tanh and no pooler_output_size")


def to_hf(config: TransformerConfig, hf: dict[str, Any]) -> None:
    hf["pooler_output_size"] = config.hidden_size


def _base_rules(config: TransformerConfig) -> list[Rule]:
    embeddings = paired_rules("transformer.embeddings.", "embeddings.", [
        ("patch_projection", "patch_embeddings.projection")])
    embeddings += [Rule(f"transformer.embeddings.{name}", f"embeddings.{name}")
                   for name in ("cls_token", "position_embeddings")]
    layers = paired_rules("transformer.layers.{i}.", "encoder.layer.{i}.", zip(LAYER_MODULES, (
        "attention.attention.query", "attention.attention.key", "attention.attention.value",
        "attention.output.dense", "layernorm_before", "intermediate.dense", "output.dense",
        "layernorm_after")))
    return embeddings + layers + paired_rules("transformer.", "", [("final_norm", "layernorm")])


FAMILY = FamilySpec(
    model_type="vit",
    display_name="ViT",
    base_prefix="vit",
    shape=dict(position_embedding="learned", norm_type="layernorm", pre_norm=True,
               embedding_norm=False, final_norm=True, ffn_type="mlp", causal=False,
               attention_bias=True, mlp_bias=True, type_vocab_size=0),
    defaults=dict(vocab_size=0, hidden_act="gelu", norm_eps=1e-12, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0, tie_word_embeddings=False, pad_token_id=None,
                  extra=dict(image_size=224, patch_size=16, num_channels=3, encoder_stride=16)),
    sizes={"tiny": stack_size(192, 12), "small": stack_size(384, 12), "base": stack_size(768, 12)},
    hf_names={name: name for name in (
        "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
        "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob",
        "initializer_range")} | {"layer_norm_eps": "norm_eps"} | {
        name: f"extra.{name}" for name in ("image_size", "patch_size", "num_channels",
                                           "encoder_stride")},
    hf_defaults=dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                     intermediate_size=3072),  # ViTConfig's (ViT-Base)
    hf_constants={"qkv_bias": True, "pooler_act": "tanh"},
    from_hf=from_hf,
    to_hf=to_hf,
    base_rules=_base_rules,
    pooler_rules=paired_rules("", "", [("pooler.dense", "pooler.dense")]),
    head_rules={IMAGE_CLASSIFICATION: lambda config: paired_rules(
        f"heads.{IMAGE_CLASSIFICATION}.", "", [("classifier", "classifier")])},
    architectures={"ViTModel": (), "ViTForImageClassification": (IMAGE_CLASSIFICATION,)},
)
