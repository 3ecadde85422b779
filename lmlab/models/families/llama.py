"""Llama-style decoders (Touvron et al. 2023; SmolLM2): rotary positions, pre-RMSNorm, SwiGLU,
grouped key/value heads, no biases (docs/decoders.md). Presets: SmolLM2-135M and CPU-sized
``"<layers>x<hidden>"`` stacks (heads of 64 dims, half as many key/value heads).
"""

from __future__ import annotations

from typing import Any

from lmlab.models.config import TransformerConfig
from lmlab.models.families import FamilySpec, Rule, paired_rules
from lmlab.models.families.gpt2 import CPU_SIZES, clm_rules  # the same lm_head, tied or not

SIZE_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
               "intermediate_size")


def from_hf(hf: dict[str, Any], values: dict[str, Any]) -> None:
    """``rope_theta`` and ``rope_scaling`` from a config.json of transformers 4 (``rope_theta``,
    ``rope_scaling`` with ``type`` or ``rope_type``) or 5 (``rope_parameters``); as there,
    ``rope_scaling`` wins, and keys its rope type does not read are dropped."""
    from lmlab.models.core.rope import ROPE_TYPES, rope_type_of  # torch: not on CLI checks

    params = dict(hf.get("rope_scaling") or hf.get("rope_parameters") or {})
    values["rope_theta"] = float(params.pop("rope_theta", None) or hf.get("rope_theta")
                                 or 10000.0)
    kind = rope_type_of(params)
    spec = ROPE_TYPES.get(kind)
    values["rope_scaling"] = {"rope_type": kind, **{
        k: v for k, v in params.items() if spec is None or k in spec.required + spec.optional}}


def to_hf(config: TransformerConfig, hf: dict[str, Any]) -> None:
    """transformers 5's ``rope_parameters`` (theta and scaling), ``rope_theta`` for 4."""
    hf.update(rope_theta=config.rope_theta,
              rope_parameters={"rope_theta": config.rope_theta,
                               **(config.rope_scaling or {"rope_type": "default"})})


def _base_rules(config: TransformerConfig) -> list[Rule]:
    ours, theirs, gguf = "transformer.layers.{i}.", "layers.{i}.", "blk.{i}."
    norms = [("attention_norm", "input_layernorm", "attn_norm"),
             ("ffn_norm", "post_attention_layernorm", "ffn_norm")]
    attention = [(f"attention.{p}_proj", f"self_attn.{p}_proj", f"attn_{g}")
                 for p, g in zip("qkvo", ("q", "k", "v", "output"))]
    mlp = [(f"feed_forward.{p}_proj", f"mlp.{p}_proj", f"ffn_{p}") for p in ("gate", "up", "down")]
    rules = [Rule("transformer.embeddings.word_embeddings.weight", "embed_tokens.weight",
                  gguf="token_embd.weight"),
             Rule("transformer.final_norm.weight", "norm.weight", gguf="output_norm.weight")]
    rules += paired_rules(ours, theirs, norms, ("weight",), gguf)
    for pairs, bias in ((attention, config.attention_bias), (mlp, config.mlp_bias)):
        rules += paired_rules(ours, theirs, pairs, ("weight", "bias") if bias else ("weight",), gguf)
    return rules


FAMILY = FamilySpec(
    model_type="llama",
    display_name="Llama",
    base_prefix="model",
    shape=dict(ffn_type="glu", type_vocab_size=0, position_embedding="rotary",
               norm_type="rmsnorm", pre_norm=True, embedding_norm=False, final_norm=True,
               causal=True),
    defaults=dict(vocab_size=49152, hidden_act="silu", max_position_embeddings=2048,
                  rope_theta=10000.0, norm_eps=1e-5, attention_bias=False, mlp_bias=False,
                  tie_word_embeddings=True, pad_token_id=None, bos_token_id=1, eos_token_id=2,
                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    sizes={"smollm2-135m": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                                num_key_value_heads=3, intermediate_size=1536,
                                max_position_embeddings=8192, rope_theta=100000.0),
           **{f"{layers}x{hidden}": dict(hidden_size=hidden, num_hidden_layers=layers,
                                         num_attention_heads=hidden // 64,
                                         num_key_value_heads=max(1, hidden // 128),
                                         intermediate_size=int(8 * hidden / 3 + 63) // 64 * 64)
              for layers, hidden in CPU_SIZES}},
    hf_names={name: name for name in (
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "intermediate_size", "hidden_act",
        "max_position_embeddings", "attention_bias", "mlp_bias", "initializer_range",
        "tie_word_embeddings", "pad_token_id", "bos_token_id", "eos_token_id")} | {
        "rms_norm_eps": "norm_eps", "attention_dropout": "attention_probs_dropout_prob"},
    hf_defaults=dict(norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=None,
                     eos_token_id=None),
    hf_constants={"use_cache": True},
    gguf_names={"vocab_size": "vocab_size", "context_length": "max_position_embeddings",
                "embedding_length": "hidden_size", "block_count": "num_hidden_layers",
                "feed_forward_length": "intermediate_size",
                "attention.head_count": "num_attention_heads",
                "attention.head_count_kv": "num_key_value_heads",
                "attention.key_length": "head_dim", "attention.value_length": "head_dim",
                "rope.dimension_count": "head_dim",
                "rope.freq_base": "rope_theta",
                "attention.layer_norm_rms_epsilon": "norm_eps"},
    required=SIZE_FIELDS,
    from_hf=from_hf,
    to_hf=to_hf,
    base_rules=_base_rules,
    head_rules={"clm": clm_rules},
    architectures={"LlamaModel": (), "LlamaForCausalLM": ("clm",)},
)
