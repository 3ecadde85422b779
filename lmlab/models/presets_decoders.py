"""Named decoder sizes: GPT-2 (small, medium and CPU-sized stacks) and Llama-style (SmolLM2-135M
and CPU-sized stacks), as :class:`TransformerConfig` values.

``decoder_config(family, **fields)`` is the family's shape (what makes a config GPT-2 or Llama)
with any size; ``decoder_preset(family, size)`` adds a named size. CPU sizes are named
``"<layers>x<hidden>"`` (``"6x384"``: 6 layers of width 384, heads of 64 dims, FFN 4x wide for
GPT-2 and 8/3x for SwiGLU). When :mod:`lmlab.models.presets` offers a ``register`` function the
presets here are registered into it (see :func:`register_into`).
"""

from __future__ import annotations

from typing import Any

from lmlab.models.config import TransformerConfig
from lmlab.utils.errors import LmlabError

# What makes a config GPT-2 or Llama, independent of its size.
FAMILY_SHAPES: dict[str, dict[str, Any]] = {
    "gpt2": dict(
        family="gpt2", vocab_size=50257, hidden_act="gelu_new", ffn_type="mlp",
        max_position_embeddings=1024, type_vocab_size=0, position_embedding="learned",
        norm_type="layernorm", norm_eps=1e-5, pre_norm=True, embedding_norm=False,
        final_norm=True, attention_bias=True, mlp_bias=True, causal=True,
        tie_word_embeddings=True, pad_token_id=None, bos_token_id=50256, eos_token_id=50256,
        hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
    ),
    "llama": dict(
        family="llama", vocab_size=49152, hidden_act="silu", ffn_type="glu",
        max_position_embeddings=2048, type_vocab_size=0, position_embedding="rotary",
        rope_theta=10000.0, norm_type="rmsnorm", norm_eps=1e-5, pre_norm=True,
        embedding_norm=False, final_norm=True, attention_bias=False, mlp_bias=False,
        causal=True, tie_word_embeddings=True, pad_token_id=None, bos_token_id=1,
        eos_token_id=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    ),
}

_SIZES: dict[tuple[str, str], dict[str, Any]] = {
    ("gpt2", "small"): dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                            intermediate_size=3072),
    ("gpt2", "medium"): dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                             intermediate_size=4096),
    ("llama", "smollm2-135m"): dict(hidden_size=576, num_hidden_layers=30,
                                    num_attention_heads=9, num_key_value_heads=3,
                                    intermediate_size=1536, max_position_embeddings=8192,
                                    rope_theta=100000.0),
}
for _layers, _hidden in ((2, 128), (4, 256), (6, 384), (8, 512)):
    _heads = _hidden // 64
    _SIZES[("gpt2", f"{_layers}x{_hidden}")] = dict(
        hidden_size=_hidden, num_hidden_layers=_layers, num_attention_heads=_heads,
        intermediate_size=4 * _hidden)
    _SIZES[("llama", f"{_layers}x{_hidden}")] = dict(
        hidden_size=_hidden, num_hidden_layers=_layers, num_attention_heads=_heads,
        num_key_value_heads=max(1, _heads // 2),
        intermediate_size=int(8 * _hidden / 3 + 63) // 64 * 64)

#: (family, size) -> the full field values of that preset.
DECODER_PRESETS: dict[tuple[str, str], dict[str, Any]] = {
    key: {**FAMILY_SHAPES[key[0]], **size} for key, size in _SIZES.items()
}


def decoder_config(family: str, **fields: Any) -> TransformerConfig:
    """A ``family`` ("gpt2" or "llama") config with the given sizes and overrides."""
    if family not in FAMILY_SHAPES:
        raise LmlabError(f"{family!r} is not a decoder family",
                         f"use one of {', '.join(FAMILY_SHAPES)}")
    return TransformerConfig(**{**FAMILY_SHAPES[family], **fields})


def decoder_preset(family: str, size: str, **overrides: Any) -> TransformerConfig:
    """The named preset, e.g. ``decoder_preset("gpt2", "6x384", vocab_size=8000)``."""
    key = (family, size)
    if key not in DECODER_PRESETS:
        sizes = sorted(s for f, s in DECODER_PRESETS if f == family)
        raise LmlabError(f"no {family} preset named {size!r}",
                         f"use one of {', '.join(sizes) or 'gpt2 / llama sizes'}")
    return TransformerConfig(**{**DECODER_PRESETS[key], **overrides})


def register_into(register: Any) -> None:
    """Register every decoder preset with ``register(family, size, values_dict)``."""
    for (family, size), values in DECODER_PRESETS.items():
        register(family, size, dict(values))
