"""GPT-2 (Radford et al. 2019): a pre-norm decoder with learned positions (docs/decoders.md).

Its Conv1D weights are stored (in, out) (``transpose``) and q, k, v fused in ``c_attn``
(``split``). Presets: small, medium and CPU-sized ``"<layers>x<hidden>"`` stacks.
"""

from __future__ import annotations

from typing import Any

from lmlab.models.config import TransformerConfig
from lmlab.models.families import FamilySpec, Rule, paired_rules, stack_size
from lmlab.utils.errors import LmlabError

CPU_SIZES = ((2, 128), (4, 256), (6, 384), (8, 512))  # (layers, hidden) of the CPU presets


def from_hf(hf: dict[str, Any], values: dict[str, Any]) -> None:
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        if hf.get(flag):
            raise LmlabError(f"GPT-2 option {flag}=true is not supported",
                             "use a checkpoint trained with the standard GPT-2 attention")
    if hf.get("scale_attn_weights", True) is False:
        raise LmlabError("GPT-2 option scale_attn_weights=false is not supported",
                         "use a checkpoint with the standard 1/sqrt(head_dim) attention scale")
    if hf.get("n_inner") is None:
        values["intermediate_size"] = 4 * values["hidden_size"]


def _base_rules(config: TransformerConfig) -> list[Rule]:
    ours = "transformer.layers.{i}."
    theirs = "h.{i}."
    blk = "blk.{i}."  # llama.cpp's gpt2 names (gguf.constants.MODEL_TENSORS[MODEL_ARCH.GPT2])
    qkv = tuple(f"{ours}attention.{p}_proj" for p in "qkv")
    rules = [
        Rule("transformer.embeddings.word_embeddings.weight", "wte.weight",
             gguf="token_embd.weight"),
        Rule("transformer.embeddings.position_embeddings.weight", "wpe.weight",
             gguf="position_embd.weight"),
        # Conv1D (in, 3H) -> transpose to (3H, in) -> q, k, v along dim 0; GGUF's attn_qkv is
        # the (3H, in) matrix (llama.cpp's converter transposes the Conv1D weights).
        Rule(tuple(f"{n}.weight" for n in qkv), f"{theirs}attn.c_attn.weight",
             transpose=True, split=0, gguf=f"{blk}attn_qkv.weight"),
        Rule(tuple(f"{n}.bias" for n in qkv), f"{theirs}attn.c_attn.bias", split=0,
             gguf=f"{blk}attn_qkv.bias"),
    ]
    for conv in (("attention.o_proj", "attn.c_proj", "attn_output"),
                 ("feed_forward.up_proj", "mlp.c_fc", "ffn_up"),
                 ("feed_forward.down_proj", "mlp.c_proj", "ffn_down")):  # Conv1D: (in, out)
        rules += paired_rules(ours, theirs, [conv], ("weight",), gguf=blk, transpose=True)
        rules += paired_rules(ours, theirs, [conv], ("bias",), gguf=blk)
    rules += paired_rules("transformer.", "", [("final_norm", "ln_f", "output_norm")], gguf="")
    return rules + paired_rules(ours, theirs, [("attention_norm", "ln_1", "attn_norm"),
                                               ("ffn_norm", "ln_2", "ffn_norm")], gguf=blk)


def clm_rules(config: TransformerConfig) -> list[Rule]:
    """The LM head: ``lm_head.weight`` (GGUF ``output.weight``), absent from the file when tied
    to the embeddings."""
    return [Rule("heads.clm.decoder.weight", "lm_head.weight",
                 optional=config.tie_word_embeddings, gguf="output.weight")]


FAMILY = FamilySpec(
    model_type="gpt2",
    display_name="GPT-2",
    base_prefix="transformer",
    shape=dict(type_vocab_size=0, position_embedding="learned", norm_type="layernorm",
               pre_norm=True, embedding_norm=False, final_norm=True, ffn_type="mlp",
               causal=True, attention_bias=True, mlp_bias=True),
    defaults=dict(vocab_size=50257, hidden_act="gelu_new", max_position_embeddings=1024,
                  norm_eps=1e-5, tie_word_embeddings=True, pad_token_id=None,
                  bos_token_id=50256, eos_token_id=50256, hidden_dropout_prob=0.1,
                  attention_probs_dropout_prob=0.1),
    sizes={"small": stack_size(768, 12), "medium": stack_size(1024, 24),
           **{f"{layers}x{hidden}": stack_size(hidden, layers) for layers, hidden in CPU_SIZES}},
    hf_names={"vocab_size": "vocab_size", "n_embd": "hidden_size",
              "n_layer": "num_hidden_layers", "n_head": "num_attention_heads",
              "n_inner": "intermediate_size", "activation_function": "hidden_act",
              "n_positions": "max_position_embeddings", "resid_pdrop": "hidden_dropout_prob",
              "embd_pdrop": "hidden_dropout_prob", "attn_pdrop": "attention_probs_dropout_prob",
              "layer_norm_epsilon": "norm_eps", "initializer_range": "initializer_range",
              "bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id",
              "pad_token_id": "pad_token_id", "tie_word_embeddings": "tie_word_embeddings"},
    hf_defaults=dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12),  # small
    hf_constants={"scale_attn_weights": True, "use_cache": True},
    gguf_names={"vocab_size": "vocab_size", "context_length": "max_position_embeddings",
                "embedding_length": "hidden_size", "block_count": "num_hidden_layers",
                "feed_forward_length": "intermediate_size",
                "attention.head_count": "num_attention_heads",
                "attention.layer_norm_epsilon": "norm_eps"},
    from_hf=from_hf,
    base_rules=_base_rules,
    head_rules={"clm": clm_rules},
    architectures={"GPT2Model": (), "GPT2LMHeadModel": ("clm",)},
)
