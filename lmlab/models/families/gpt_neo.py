"""GPT-Neo (EleutherAI): GPT-2's pre-norm decoder with GPT-3's alternating dense and locally
banded layers (``attention_types``, ``window_size``: lmlab's per-layer ``attention_window``,
docs/long-attention.md), unscaled scores and bias-free q, k, v maps.
"""

from __future__ import annotations

from typing import Any

from lmlab.models.config import TransformerConfig
from lmlab.models.families import FamilySpec, Rule, paired_rules
from lmlab.models.families.gpt2 import clm_rules
from lmlab.utils.errors import LmlabError

KINDS = ("global", "local")


def from_hf(hf: dict[str, Any], values: dict[str, Any]) -> None:
    kinds = [kind for names, count in hf.get("attention_types") or [[list(KINDS), 12]]
             for _ in range(count) for kind in names]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise LmlabError(f"GPT-Neo attention types {unknown} are not supported",
                         "use 'global' and 'local' layers")
    window = int(hf.get("window_size", 256))
    values["attention_window"] = [window if kind == "local" else 0 for kind in kinds]
    if values.get("intermediate_size") is None:
        values["intermediate_size"] = 4 * values["hidden_size"]


def to_hf(config: TransformerConfig, hf: dict[str, Any]) -> None:
    windows = [config.layer_window(i) for i in range(config.num_hidden_layers)]
    local = sorted({w for w in windows if w})
    if len(local) > 1:
        raise LmlabError(f"GPT-Neo has one local window; this config has {local}",
                         "use one window for every local layer (or lmlab's own format)")
    hf["attention_types"] = [[[KINDS[bool(w)] for w in windows], 1]]
    hf["window_size"] = local[0] if local else 256


def _base_rules(config: TransformerConfig) -> list[Rule]:
    ours, theirs = "transformer.layers.{i}.", "h.{i}."
    rules = [Rule("transformer.embeddings.word_embeddings.weight", "wte.weight"),
             Rule("transformer.embeddings.position_embeddings.weight", "wpe.weight")]
    rules += paired_rules(ours, theirs, [(f"attention.{p}_proj", f"attn.attention.{p}_proj")
                                         for p in "qkv"], ("weight",))
    rules += paired_rules(ours, theirs, [("attention.o_proj", "attn.attention.out_proj"),
                                         ("feed_forward.up_proj", "mlp.c_fc"),
                                         ("feed_forward.down_proj", "mlp.c_proj"),
                                         ("attention_norm", "ln_1"), ("ffn_norm", "ln_2")])
    return rules + paired_rules("transformer.", "", [("final_norm", "ln_f")])


FAMILY = FamilySpec(
    model_type="gpt_neo",
    display_name="GPT-Neo",
    base_prefix="transformer",
    shape=dict(type_vocab_size=0, position_embedding="learned", norm_type="layernorm",
               pre_norm=True, embedding_norm=False, final_norm=True, ffn_type="mlp",
               causal=True, attention_bias=False, attention_out_bias=True, mlp_bias=True,
               attention_scale=1.0),
    defaults=dict(vocab_size=50257, hidden_act="gelu_new", max_position_embeddings=2048,
                  norm_eps=1e-5, tie_word_embeddings=True, pad_token_id=None,
                  bos_token_id=50256, eos_token_id=50256, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0),
    sizes={"tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=512, attention_window=[0, 32]),  # CPU runs
           "125m": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                        intermediate_size=3072, attention_window=[0, 256] * 6),
           "1.3b": dict(hidden_size=2048, num_hidden_layers=24, num_attention_heads=16,
                        intermediate_size=8192, attention_window=[0, 256] * 12)},
    hf_names={"vocab_size": "vocab_size", "hidden_size": "hidden_size",
              "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
              "intermediate_size": "intermediate_size", "activation_function": "hidden_act",
              "max_position_embeddings": "max_position_embeddings",
              "resid_dropout": "hidden_dropout_prob",
              "attention_dropout": "attention_probs_dropout_prob",
              "layer_norm_epsilon": "norm_eps", "initializer_range": "initializer_range",
              "bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id",
              "pad_token_id": "pad_token_id", "tie_word_embeddings": "tie_word_embeddings"},
    hf_defaults=dict(hidden_size=2048, num_hidden_layers=24, num_attention_heads=16),
    from_hf=from_hf,
    to_hf=to_hf,
    base_rules=_base_rules,
    head_rules={"clm": clm_rules},
    architectures={"GPTNeoModel": (), "GPTNeoForCausalLM": ("clm",)},
    task_heads={"sequence-classification": "last-token", "token-classification": "tokens",
                "question-answering": "span"},
)
