"""DistilBERT (Sanh et al. 2019): a 6-layer BERT distilled from BERT-base, without token types.

Config names differ from BERT's (``dim``, ``hidden_dim``, ``n_layers``, ``n_heads``,
``activation``, ``dropout``, ``attention_dropout``); every LayerNorm uses eps 1e-12.

``sinusoidal_pos_embds: true`` maps to ``position_embedding="sinusoidal"``. Hugging Face fills
that table once (in float64, cast to float32: even dims sin, odd dims cos of
``pos / 10000^(2(j//2)/dim)``) and *saves it as a weight* (``embeddings.position_embeddings
.weight``); lmlab loads the stored table into its fixed ``sinusoids`` buffer, so outputs match
bit for bit, and writes the buffer back when saving.
"""

from __future__ import annotations

from typing import Any

from lmlab.interop.families import FamilySpec, Rule
from lmlab.interop.families.bert import mlm_rules
from lmlab.models.config import TransformerConfig
from lmlab.utils.errors import LmlabError


def config_from_hf(hf: dict[str, Any]) -> TransformerConfig:
    try:
        dim, layers, heads = hf["dim"], hf["n_layers"], hf["n_heads"]
    except KeyError as error:
        raise LmlabError(f"DistilBERT config.json lacks {error.args[0]!r}",
                         "a DistilBERT config names its sizes dim, hidden_dim, n_layers, n_heads"
                         ) from None
    return TransformerConfig(
        family="distilbert",
        vocab_size=hf["vocab_size"],
        hidden_size=dim,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=hf.get("hidden_dim", 4 * dim),
        hidden_act=hf.get("activation", "gelu"),
        hidden_dropout_prob=hf.get("dropout", 0.1),
        attention_probs_dropout_prob=hf.get("attention_dropout", 0.1),
        max_position_embeddings=hf.get("max_position_embeddings", 512),
        position_embedding="sinusoidal" if hf.get("sinusoidal_pos_embds") else "learned",
        type_vocab_size=0,
        norm_eps=1e-12,
        initializer_range=hf.get("initializer_range", 0.02),
        pad_token_id=hf.get("pad_token_id", 0),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=hf.get("eos_token_id"),
        tie_word_embeddings=hf.get("tie_word_embeddings", True),
        extra={k: hf[k] for k in ("qa_dropout", "seq_classif_dropout") if k in hf},
    )


def config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    if config.type_vocab_size:
        raise LmlabError("DistilBERT has no token-type embeddings, but this config has "
                         f"type_vocab_size={config.type_vocab_size}",
                         "set type_vocab_size=0, or save the model as family 'bert'")
    if config.position_embedding not in ("learned", "sinusoidal") or config.embedding_size not in (
            None, config.hidden_size) or config.norm_eps != 1e-12:
        raise LmlabError("this config cannot be written as DistilBERT (it needs learned or "
                         "sinusoidal positions, no factorised embeddings, LayerNorm eps 1e-12)",
                         "use preset('distilbert', 'base') or save it as family 'bert'")
    return {
        "model_type": "distilbert",
        "vocab_size": config.vocab_size,
        "dim": config.hidden_size,
        "hidden_dim": config.intermediate_size,
        "n_layers": config.num_hidden_layers,
        "n_heads": config.num_attention_heads,
        "activation": config.hidden_act,
        "dropout": config.hidden_dropout_prob,
        "attention_dropout": config.attention_probs_dropout_prob,
        "max_position_embeddings": config.max_position_embeddings,
        "sinusoidal_pos_embds": config.position_embedding == "sinusoidal",
        "initializer_range": config.initializer_range,
        "pad_token_id": config.pad_token_id,
        "tie_word_embeddings": config.tie_word_embeddings,
        "qa_dropout": config.extra.get("qa_dropout", 0.1),
        "seq_classif_dropout": config.extra.get("seq_classif_dropout", 0.2),
    }


def _base_rules(config: TransformerConfig) -> list[Rule]:
    position = ("transformer.embeddings.sinusoids" if config.position_embedding == "sinusoidal"
                else "transformer.embeddings.position_embeddings.weight")
    rules = [
        Rule("transformer.embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight"),
        Rule(position, "embeddings.position_embeddings.weight"),
        Rule("transformer.embeddings.norm.weight", "embeddings.LayerNorm.weight"),
        Rule("transformer.embeddings.norm.bias", "embeddings.LayerNorm.bias"),
    ]
    ours = "transformer.layers.{i}."
    pairs = [
        ("attention.q_proj", "attention.q_lin"),
        ("attention.k_proj", "attention.k_lin"),
        ("attention.v_proj", "attention.v_lin"),
        ("attention.o_proj", "attention.out_lin"),
        ("attention_norm", "sa_layer_norm"),
        ("feed_forward.up_proj", "ffn.lin1"),
        ("feed_forward.down_proj", "ffn.lin2"),
        ("ffn_norm", "output_layer_norm"),
    ]
    rules += [Rule(f"{ours}{a}.{p}", f"transformer.layer.{{i}}.{b}.{p}")
              for a, b in pairs for p in ("weight", "bias")]
    return rules


FAMILY = FamilySpec(
    model_type="distilbert",
    base_prefix="distilbert",
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    base_rules=_base_rules,
    head_rules={
        "mlm": lambda config: mlm_rules("", transform="vocab_transform", norm="vocab_layer_norm",
                                        decoder="vocab_projector", bias=None,
                                        tied=config.tie_word_embeddings),
    },
    architectures={
        "DistilBertModel": (),
        "DistilBertForMaskedLM": ("mlm",),
    },
)
