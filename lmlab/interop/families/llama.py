"""Llama-style decoders (Touvron et al. 2023; SmolLM2): the same core as GPT-2, configured.

Rotary positions (``rope_theta``), RMSNorm before each sublayer and after the last, a SwiGLU
feed-forward (``ffn_type="glu"``, ``silu``), grouped key/value heads, no biases, and an LM head
tied to the embeddings or not (``tie_word_embeddings``). Hugging Face names are
``model.embed_tokens``, ``model.layers.{i}.self_attn.{q,k,v,o}_proj``,
``model.layers.{i}.mlp.{gate,up,down}_proj``, ``input_layernorm``, ``post_attention_layernorm``,
``model.norm`` and ``lm_head``.
"""

from __future__ import annotations

from typing import Any

from lmlab.interop.families import FamilySpec, Rule, pick
from lmlab.interop.families.gpt2 import clm_rules  # the same lm_head, tied or not
from lmlab.models.config import TransformerConfig
from lmlab.utils.errors import LmlabError


def _rope_theta(hf: dict[str, Any]) -> float:
    """``rope_theta`` from a config.json of transformers 4 (top level) or 5 (rope_parameters)."""
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind != "default":
        raise LmlabError(f"RoPE scaling {kind!r} is not supported",
                         "use a checkpoint with plain rotary embeddings (rope_type 'default')")
    return float(pick(params, "rope_theta", default=None) or hf.get("rope_theta") or 10000.0)


def config_from_hf(hf: dict[str, Any]) -> TransformerConfig:
    """A Llama ``config.json`` as a :class:`TransformerConfig`."""
    heads = hf["num_attention_heads"]
    return TransformerConfig(
        family="llama",
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_hidden_layers=hf["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        intermediate_size=hf["intermediate_size"],
        hidden_act=hf.get("hidden_act", "silu"),
        ffn_type="glu",
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
        type_vocab_size=0,
        position_embedding="rotary",
        rope_theta=_rope_theta(hf),
        norm_type="rmsnorm",
        norm_eps=hf.get("rms_norm_eps", 1e-6),
        pre_norm=True,
        embedding_norm=False,
        final_norm=True,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=hf.get("attention_dropout", 0.0),
        attention_bias=hf.get("attention_bias", False),
        mlp_bias=hf.get("mlp_bias", False),
        causal=True,
        tie_word_embeddings=hf.get("tie_word_embeddings", False),
        initializer_range=hf.get("initializer_range", 0.02),
        pad_token_id=hf.get("pad_token_id"),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=hf.get("eos_token_id"),
    )


def config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    """The ``config.json`` transformers' Llama classes read for ``config``."""
    if config.position_embedding != "rotary" or config.norm_type != "rmsnorm" \
            or config.ffn_type != "glu" or not config.causal:
        raise LmlabError("this config is not Llama shaped (needs rotary positions, RMSNorm, a "
                         "gated feed-forward and a causal mask)",
                         "save it under its own family, or build it from a llama preset")
    return {
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "intermediate_size": config.intermediate_size,
        "hidden_act": config.hidden_act,
        "max_position_embeddings": config.max_position_embeddings,
        "rope_theta": config.rope_theta,
        "rope_parameters": {"rope_theta": config.rope_theta, "rope_type": "default"},
        "rms_norm_eps": config.norm_eps,
        "attention_bias": config.attention_bias,
        "attention_dropout": config.attention_probs_dropout_prob,
        "mlp_bias": config.mlp_bias,
        "initializer_range": config.initializer_range,
        "tie_word_embeddings": config.tie_word_embeddings,
        "pad_token_id": config.pad_token_id,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "use_cache": True,
    }


def _base_rules(config: TransformerConfig) -> list[Rule]:
    ours = "transformer.layers.{i}."
    theirs = "layers.{i}."
    pairs = [(f"attention.{p}_proj", f"self_attn.{p}_proj", config.attention_bias)
             for p in "qkvo"]
    pairs += [(f"feed_forward.{p}_proj", f"mlp.{p}_proj", config.mlp_bias)
              for p in ("gate", "up", "down")]
    rules = [Rule("transformer.embeddings.word_embeddings.weight", "embed_tokens.weight"),
             Rule("transformer.final_norm.weight", "norm.weight"),
             Rule(f"{ours}attention_norm.weight", f"{theirs}input_layernorm.weight"),
             Rule(f"{ours}ffn_norm.weight", f"{theirs}post_attention_layernorm.weight")]
    for a, b, bias in pairs:
        rules.append(Rule(f"{ours}{a}.weight", f"{theirs}{b}.weight"))
        if bias:
            rules.append(Rule(f"{ours}{a}.bias", f"{theirs}{b}.bias"))
    return rules


FAMILY = FamilySpec(
    model_type="llama",
    base_prefix="model",
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    base_rules=_base_rules,
    head_rules={"clm": clm_rules},
    architectures={"LlamaModel": (), "LlamaForCausalLM": ("clm",)},
)
