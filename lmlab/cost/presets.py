"""Model size presets for cost estimates: the shapes of the published checkpoints.

This table is self-contained on purpose: the cost module must be able to estimate a run before
any model code exists. When ``lmlab.models`` grows its own family presets, these can be replaced
by a lookup there; until then they are the single place the cost estimator gets shapes from.

Each row is (layers, hidden, heads, intermediate, vocab) plus the few settings that change the
FLOP count (causal attention, GLU feed-forward, factorised embeddings, grouped KV heads).
"""

from __future__ import annotations

from typing import Any

from lmlab.utils.errors import LmlabError

# name -> (layers, hidden, heads, intermediate, vocab, extra TransformerConfig fields)
_PRESETS: dict[str, tuple[int, int, int, int, int, dict[str, Any]]] = {
    # Turc et al. 2019, "Well-Read Students Learn Better" (the 24 small BERTs).
    "bert-tiny": (2, 128, 2, 512, 30522, {}),
    "bert-mini": (4, 256, 4, 1024, 30522, {}),
    "bert-small": (4, 512, 8, 2048, 30522, {}),
    "bert-medium": (8, 512, 8, 2048, 30522, {}),
    # Devlin et al. 2019.
    "bert-base": (12, 768, 12, 3072, 30522, {}),
    "bert-large": (24, 1024, 16, 4096, 30522, {}),
    # Liu et al. 2019 (byte-level BPE, 50265 tokens).
    "roberta-base": (12, 768, 12, 3072, 50265, {
        "family": "roberta", "type_vocab_size": 1, "max_position_embeddings": 514,
        "norm_eps": 1e-5,
    }),
    # Lan et al. 2020: factorised embeddings (E=128) and one set of layer weights.
    "albert-base": (12, 768, 12, 3072, 30000, {
        "family": "albert", "embedding_size": 128, "share_layers": True,
    }),
    # Clark et al. 2020: the discriminator's shape (the generator is costed separately).
    "electra-small": (12, 256, 4, 1024, 30522, {"family": "electra", "embedding_size": 128}),
    "electra-base": (12, 768, 12, 3072, 30522, {"family": "electra"}),
    # Sanh et al. 2019.
    "distilbert": (6, 768, 12, 3072, 30522, {"family": "distilbert", "type_vocab_size": 0}),
    # Radford et al. 2019.
    "gpt2-small": (12, 768, 12, 3072, 50257, {
        "family": "gpt2", "causal": True, "pre_norm": True, "final_norm": True,
        "embedding_norm": False, "type_vocab_size": 0, "max_position_embeddings": 1024,
        "hidden_act": "gelu_new", "norm_eps": 1e-5,
    }),
    "gpt2-medium": (24, 1024, 16, 4096, 50257, {
        "family": "gpt2", "causal": True, "pre_norm": True, "final_norm": True,
        "embedding_norm": False, "type_vocab_size": 0, "max_position_embeddings": 1024,
        "hidden_act": "gelu_new", "norm_eps": 1e-5,
    }),
    # HuggingFaceTB SmolLM2-135M: Llama-style, 9 query heads sharing 3 KV heads, SwiGLU.
    "smollm2-135m": (30, 576, 9, 1536, 49152, {
        "family": "llama", "num_key_value_heads": 3, "causal": True, "ffn_type": "glu",
        "hidden_act": "silu", "norm_type": "rmsnorm", "norm_eps": 1e-5, "pre_norm": True,
        "final_norm": True, "embedding_norm": False, "position_embedding": "rotary",
        "type_vocab_size": 0, "attention_bias": False, "mlp_bias": False,
        "max_position_embeddings": 8192, "rope_theta": 100000.0,
    }),
}


def preset_names() -> list[str]:
    """Names accepted by :func:`preset_config` (and ``lmlab cost estimate --model``)."""
    return list(_PRESETS)


def preset_config(name: str):
    """The :class:`~lmlab.models.config.TransformerConfig` of a published model size.

    Raises:
        LmlabError: for an unknown name (the message lists the known ones).
    """
    from lmlab.models.config import TransformerConfig

    key = name.strip().lower()
    if key not in _PRESETS:
        raise LmlabError(f"unknown model size {name!r}",
                         f"use one of: {', '.join(_PRESETS)}")
    layers, hidden, heads, intermediate, vocab, extra = _PRESETS[key]
    values: dict[str, Any] = {
        "num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
        "intermediate_size": intermediate, "vocab_size": vocab,
    }
    values.update(extra)
    return TransformerConfig(**values)


def default_head(config) -> str:
    """The pretraining head a config's family uses: ``"clm"`` for causal stacks, else ``"mlm"``."""
    return "clm" if config.causal else "mlm"
