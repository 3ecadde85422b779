"""GPT-2 (Radford et al. 2019): a pre-norm decoder with learned positions, on the shared core.

What differs from BERT is all configuration: no segment embeddings, no norm after the
embeddings, LayerNorm *before* each sublayer plus a final ``ln_f``, a causal mask, the tanh GELU
(``gelu_new``) and an LM head tied to the token embeddings. Two checkpoint details need
transforms: OpenAI's ``Conv1D`` stores weights as (in, out) (``transpose=True``), and the query,
key and value projections are fused into one ``c_attn`` tensor (``split=0`` after the transpose).
"""

from __future__ import annotations

from typing import Any

from lmlab.interop.families import FamilySpec, Rule
from lmlab.models.config import TransformerConfig
from lmlab.utils.errors import LmlabError


def config_from_hf(hf: dict[str, Any]) -> TransformerConfig:
    """A GPT-2 ``config.json`` as a :class:`TransformerConfig`."""
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        if hf.get(flag):
            raise LmlabError(f"GPT-2 option {flag}=true is not supported",
                             "use a checkpoint trained with the standard GPT-2 attention")
    if hf.get("scale_attn_weights", True) is False:
        raise LmlabError("GPT-2 option scale_attn_weights=false is not supported",
                         "use a checkpoint with the standard 1/sqrt(head_dim) attention scale")
    hidden = hf.get("n_embd", 768)
    return TransformerConfig(
        family="gpt2",
        vocab_size=hf.get("vocab_size", 50257),
        hidden_size=hidden,
        num_hidden_layers=hf.get("n_layer", 12),
        num_attention_heads=hf.get("n_head", 12),
        intermediate_size=hf.get("n_inner") or 4 * hidden,
        hidden_act=hf.get("activation_function", "gelu_new"),
        max_position_embeddings=hf.get("n_positions", 1024),
        type_vocab_size=0,
        position_embedding="learned",
        norm_type="layernorm",
        norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        pre_norm=True,
        embedding_norm=False,
        final_norm=True,
        hidden_dropout_prob=hf.get("resid_pdrop", 0.1),
        attention_probs_dropout_prob=hf.get("attn_pdrop", 0.1),
        attention_bias=True,
        mlp_bias=True,
        causal=True,
        tie_word_embeddings=hf.get("tie_word_embeddings", True),
        initializer_range=hf.get("initializer_range", 0.02),
        pad_token_id=hf.get("pad_token_id"),
        bos_token_id=hf.get("bos_token_id", 50256),
        eos_token_id=hf.get("eos_token_id", 50256),
    )


def config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    """The ``config.json`` transformers' GPT2 classes read for ``config``."""
    if config.position_embedding != "learned" or config.norm_type != "layernorm" \
            or not config.pre_norm or not config.causal or config.ffn_type != "mlp":
        raise LmlabError("this config is not GPT-2 shaped (needs learned positions, pre-norm "
                         "LayerNorm, a plain MLP and a causal mask)",
                         "save it under its own family, or build it from the gpt2 preset")
    return {
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_embd": config.hidden_size,
        "n_layer": config.num_hidden_layers,
        "n_head": config.num_attention_heads,
        "n_inner": config.intermediate_size,
        "activation_function": config.hidden_act,
        "n_positions": config.max_position_embeddings,
        "resid_pdrop": config.hidden_dropout_prob,
        "embd_pdrop": config.hidden_dropout_prob,
        "attn_pdrop": config.attention_probs_dropout_prob,
        "layer_norm_epsilon": config.norm_eps,
        "initializer_range": config.initializer_range,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id,
        "tie_word_embeddings": config.tie_word_embeddings,
        "scale_attn_weights": True,
        "use_cache": True,
    }


def _base_rules(config: TransformerConfig) -> list[Rule]:
    ours = "transformer.layers.{i}."
    theirs = "h.{i}."
    qkv = tuple(f"{ours}attention.{p}_proj" for p in "qkv")
    rules = [
        Rule("transformer.embeddings.word_embeddings.weight", "wte.weight"),
        Rule("transformer.embeddings.position_embeddings.weight", "wpe.weight"),
        # Conv1D (in, 3H) -> transpose to (3H, in) -> q, k, v along dim 0.
        Rule(tuple(f"{n}.weight" for n in qkv), f"{theirs}attn.c_attn.weight",
             transpose=True, split=0),
        Rule(tuple(f"{n}.bias" for n in qkv), f"{theirs}attn.c_attn.bias", split=0),
        Rule(f"{ours}attention.o_proj.weight", f"{theirs}attn.c_proj.weight", transpose=True),
        Rule(f"{ours}attention.o_proj.bias", f"{theirs}attn.c_proj.bias"),
        Rule(f"{ours}feed_forward.up_proj.weight", f"{theirs}mlp.c_fc.weight", transpose=True),
        Rule(f"{ours}feed_forward.up_proj.bias", f"{theirs}mlp.c_fc.bias"),
        Rule(f"{ours}feed_forward.down_proj.weight", f"{theirs}mlp.c_proj.weight",
             transpose=True),
        Rule(f"{ours}feed_forward.down_proj.bias", f"{theirs}mlp.c_proj.bias"),
        Rule("transformer.final_norm.weight", "ln_f.weight"),
        Rule("transformer.final_norm.bias", "ln_f.bias"),
    ]
    for ours_norm, theirs_norm in (("attention_norm", "ln_1"), ("ffn_norm", "ln_2")):
        rules += [Rule(f"{ours}{ours_norm}.{p}", f"{theirs}{theirs_norm}.{p}")
                  for p in ("weight", "bias")]
    return rules


def clm_rules(config: TransformerConfig) -> list[Rule]:
    """The LM head: ``lm_head.weight``, absent from the file when tied to the embeddings."""
    return [Rule("heads.clm.decoder.weight", "lm_head.weight",
                 optional=config.tie_word_embeddings)]


FAMILY = FamilySpec(
    model_type="gpt2",
    base_prefix="transformer",
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    base_rules=_base_rules,
    head_rules={"clm": clm_rules},
    architectures={"GPT2Model": (), "GPT2LMHeadModel": ("clm",)},
)
