"""mT5 (Xue et al. 2021): T5 v1.1 (gated-GELU feed-forward, untied output projection, decoder
states never rescaled) under ``model_type`` "mt5" with a vocabulary of 250,112 pieces; T5's rules,
shape and config names (docs/models.md)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from lmlab.models.families.t5 import FAMILY as T5
from lmlab.models.families.t5 import from_hf as t5_from_hf

V11 = dict(ffn_type="glu", hidden_act="gelu_new", tie_word_embeddings=False,
           hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # no dropout in pretraining


def from_hf(hf: dict[str, Any], values: dict[str, Any]) -> None:
    """T5's reading (an ``MT5EncoderModel`` folder: the encoder alone), then mT5's:
    transformers' MT5 never rescales the decoder's states (its
    config writes ``tie_word_embeddings`` true whether or not the head is tied)."""
    t5_from_hf({"feed_forward_proj": "gated-gelu", **hf}, values)
    values["extra"]["scale_decoder_outputs"] = False


def _size(hidden: int, layers: int, heads: int, ffn: int) -> dict[str, Any]:
    return dict(hidden_size=hidden, num_hidden_layers=layers, num_decoder_layers=layers,
                num_attention_heads=heads, head_dim=64, intermediate_size=ffn)


FAMILY = replace(
    T5,
    model_type="mt5",
    display_name="mT5",
    defaults={**T5.defaults, **V11, "vocab_size": 250112,
              "extra": {**T5.defaults["extra"], "scale_decoder_outputs": False}},
    # T5 v1.1's sizes (mt5-small/base/large config.json), and CPU-sized tiny and mini
    sizes={"tiny": _size(128, 2, 2, 256), "mini": _size(256, 4, 4, 512),
           "small": _size(512, 8, 6, 1024), "base": _size(768, 12, 12, 2048),
           "large": _size(1024, 24, 16, 2816)},
    from_hf=from_hf,
    architectures={"MT5Model": (), "MT5ForConditionalGeneration": ("seq2seq-lm",)},
    encoder_class="MT5EncoderModel",
)
