"""Marian (Junczys-Dowmunt et al. 2018; OPUS-MT): the original Transformer (Vaswani et al. 2017)
under BART's tensor names, with fixed "halves" sinusoids, scaled embeddings and one vocabulary
(docs/encoder-decoders.md). Presets: the paper's base and big.
"""

from __future__ import annotations

from typing import Any

from lmlab.models.config import TransformerConfig
from lmlab.models.families import FamilySpec, stack_size
from lmlab.models.families.bart import (
    FAIRSEQ_HF_NAMES,
    FAIRSEQ_SHAPE,
    FAIRSEQ_SIZE_FIELDS,
    check_symmetric_stacks,
    fairseq_layout_rules,
    seq2seq_lm_rules,
    write_both_stacks,
)
from lmlab.utils.errors import LmlabError


def from_hf(hf: dict[str, Any], values: dict[str, Any]) -> None:
    check_symmetric_stacks(hf)
    target_vocab = hf.get("decoder_vocab_size")
    if target_vocab is not None and target_vocab != values["vocab_size"]:
        raise LmlabError(
            f"this Marian checkpoint has separate source and target vocabularies (vocab_size="
            f"{values['vocab_size']}, decoder_vocab_size={target_vocab})",
            "lmlab's encoder-decoders read one vocabulary on both sides (their tables may "
            "differ); use a checkpoint with a joint vocabulary (most OPUS-MT models)")
    values["share_embeddings"] = hf.get("share_encoder_decoder_embeddings", True) is not False
    values.setdefault("extra", {}).setdefault("decoder_start_token_id", values["pad_token_id"])
    values["extra"]["sinusoid_layout"] = "halves"


def to_hf(config: TransformerConfig, hf: dict[str, Any]) -> None:
    if config.extra.get("sinusoid_layout") != "halves":
        raise LmlabError("a Marian checkpoint has sinusoids in the 'halves' layout, but this "
                         "config's extra['sinusoid_layout'] is "
                         f"{config.extra.get('sinusoid_layout')!r}",
                         "build the config from preset('marian', ...)")
    write_both_stacks(config, hf)
    hf["decoder_vocab_size"] = config.vocab_size
    hf["share_encoder_decoder_embeddings"] = config.share_embeddings


FAMILY = FamilySpec(
    model_type="marian",
    display_name="Marian",
    base_prefix="model",
    shape=dict(FAIRSEQ_SHAPE, position_embedding="sinusoidal", position_offset=0,
               embedding_norm=False),
    defaults=dict(vocab_size=58101, hidden_act="swish", max_position_embeddings=512,
                  norm_eps=1e-5, pad_token_id=58100, bos_token_id=None, eos_token_id=0,
                  tie_word_embeddings=True, scale_embedding=True, hidden_dropout_prob=0.1,
                  attention_probs_dropout_prob=0.0,
                  extra={"decoder_start_token_id": 58100, "forced_eos_token_id": 0,
                         "sinusoid_layout": "halves"}),
    sizes={"base": stack_size(512, 6, num_decoder_layers=6),
           "big": stack_size(1024, 6, num_decoder_layers=6)},
    hf_names=FAIRSEQ_HF_NAMES,
    hf_defaults=dict(max_position_embeddings=1024, scale_embedding=False, hidden_act="gelu"),
    required=FAIRSEQ_SIZE_FIELDS,
    from_hf=from_hf,
    to_hf=to_hf,
    base_rules=fairseq_layout_rules,
    head_rules={"seq2seq-lm": seq2seq_lm_rules},
    architectures={"MarianModel": (), "MarianMTModel": ("seq2seq-lm",)},
)
