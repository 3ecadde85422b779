"""T5 (Raffel et al. 2020), v1.0 and v1.1: a pre-norm encoder-decoder with relative position
buckets, unscaled attention and no biases (docs/encoder-decoders.md). Presets: small, base,
``v1.1-small`` and CPU-sized ``tiny`` and ``mini``.
"""

from __future__ import annotations

from typing import Any

from lmlab.models.config import TransformerConfig
from lmlab.models.families import FamilySpec, Rule, paired_rules
from lmlab.utils.errors import LmlabError


def feed_forward(projection: str) -> tuple[str, str]:
    """``feed_forward_proj`` of config.json -> (ffn_type, hidden_act), read as transformers
    reads it: ``"<act>"`` or ``"gated-<act>"``, where ``"gated-gelu"`` means the tanh GELU."""
    from lmlab.models.core.activations import ACTIVATION_NAMES

    parts = projection.split("-")
    gated = len(parts) == 2 and parts[0] == "gated"
    if len(parts) > 2 or (len(parts) == 2 and not gated) or parts[-1] not in ACTIVATION_NAMES:
        raise LmlabError(f"T5 feed_forward_proj={projection!r} is not supported",
                         "use '<activation>' or 'gated-<activation>' (relu, gelu, gated-gelu, "
                         "...)")
    act = "gelu_new" if projection == "gated-gelu" else parts[-1]
    return ("glu" if gated else "mlp"), act


def projection_name(ffn_type: str, act: str) -> str:
    """The ``feed_forward_proj`` that reads back as (ffn_type, act); refused if none does."""
    name = {("glu", "gelu_new"): "gated-gelu"}.get((ffn_type, act)) or \
        (f"gated-{act}" if ffn_type == "glu" else act)
    if feed_forward(name) != (ffn_type, act):
        raise LmlabError(f"T5's config.json cannot express a {ffn_type} feed-forward with "
                         f"{act}", "use relu, gelu or gated-gelu (GeGLU with the tanh GELU)")
    return name


def is_encoder_alone(hf: dict[str, Any]) -> bool:
    """Whether config.json is a ``T5EncoderModel``'s (``MT5EncoderModel``'s): the encoder only."""
    return any(str(name).endswith("EncoderModel") for name in hf.get("architectures") or ())


def from_hf(hf: dict[str, Any], values: dict[str, Any]) -> None:
    values["ffn_type"], values["hidden_act"] = feed_forward(hf.get("feed_forward_proj", "relu"))
    values["attention_probs_dropout_prob"] = values["hidden_dropout_prob"]  # one dropout_rate
    if is_encoder_alone(hf):  # one bidirectional stack: a LanguageModel (models/classes.py)
        values["is_encoder_decoder"], values["num_decoder_layers"] = False, None
    elif hf.get("num_decoder_layers") is None:
        values["num_decoder_layers"] = values["num_hidden_layers"]
    extra = values.setdefault("extra", {})
    extra.setdefault("decoder_start_token_id", values["pad_token_id"])
    # transformers 5 saves tie_word_embeddings=true for every T5 and says whether v1.0's scaling
    # applies in scale_decoder_outputs; older files only have tie_word_embeddings (false: v1.1)
    extra["scale_decoder_outputs"] = bool(hf.get("scale_decoder_outputs",
                                                 values["tie_word_embeddings"]))
    extra["pad_row_trains"] = True


def to_hf(config: TransformerConfig, hf: dict[str, Any]) -> None:
    projection = projection_name(config.ffn_type, config.hidden_act)
    scaled = bool(config.extra.get("scale_decoder_outputs"))
    if scaled and not config.tie_word_embeddings:
        raise LmlabError("scale_decoder_outputs with an untied output projection: transformers "
                         "scales T5's decoder states only when the head is tied",
                         "set config.extra['scale_decoder_outputs'] = False (T5 v1.1) or tie "
                         "the head (v1.0)")
    if config.attention_probs_dropout_prob != config.hidden_dropout_prob:
        raise LmlabError(f"T5 has one dropout rate, but this config has hidden "
                         f"{config.hidden_dropout_prob} and attention "
                         f"{config.attention_probs_dropout_prob}",
                         "set attention_probs_dropout_prob = hidden_dropout_prob")
    hf["feed_forward_proj"] = projection
    hf["is_gated_act"] = config.ffn_type == "glu"
    hf["dense_act_fn"] = config.hidden_act
    hf["is_encoder_decoder"] = config.is_encoder_decoder  # False: T5EncoderModel
    hf["scale_decoder_outputs"] = scaled


def _feed_forward_rules(ours: str, theirs: str, gated: bool) -> list[Rule]:
    inner = [("gate_proj", "wi_0"), ("up_proj", "wi_1")] if gated else [("up_proj", "wi")]
    return paired_rules(f"{ours}feed_forward.", f"{theirs}DenseReluDense.",
                        inner + [("down_proj", "wo")], ("weight",))


def _attention_rules(ours: str, theirs: str) -> list[Rule]:
    return paired_rules(ours, theirs, [(f"{p}_proj", p) for p in "qkvo"], ("weight",))


def encoder_rules(config: TransformerConfig) -> list[Rule]:
    """``T5EncoderModel``'s tensors on a :class:`~lmlab.models.model.LanguageModel`'s stack."""
    ours, theirs = "transformer.layers.{i}.", "encoder.block.{i}.layer."
    return [Rule("transformer.embeddings.word_embeddings.weight", "shared.weight"),
            Rule("transformer.embeddings.word_embeddings.weight", "encoder.embed_tokens.weight",
                 optional=True),
            Rule("transformer.relative_bias.embedding.weight",
                 "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"),
            *_attention_rules(f"{ours}attention.", f"{theirs}0.SelfAttention."),
            Rule(f"{ours}attention_norm.weight", f"{theirs}0.layer_norm.weight"),
            *_feed_forward_rules(ours, f"{theirs}1.", config.ffn_type == "glu"),
            Rule(f"{ours}ffn_norm.weight", f"{theirs}1.layer_norm.weight"),
            Rule("transformer.final_norm.weight", "encoder.final_layer_norm.weight")]


def base_rules(config: TransformerConfig) -> list[Rule]:
    """The bare model's tensors: shared table, bucket tables, every block, final norms."""
    if not config.is_encoder_decoder:
        return encoder_rules(config)
    gated = config.ffn_type == "glu"
    rules = [Rule("encoder.embeddings.word_embeddings.weight", "shared.weight"),
             Rule("encoder.embeddings.word_embeddings.weight", "encoder.embed_tokens.weight",
                  optional=True),
             Rule("decoder.embeddings.word_embeddings.weight", "decoder.embed_tokens.weight",
                  optional=True)]
    for stack, index, ffn_at in (("encoder", "{i}", 1), ("decoder", "{j}", 2)):
        ours, theirs = f"{stack}.layers.{index}.", f"{stack}.block.{index}.layer."
        rules.append(Rule(f"{stack}.relative_bias.embedding.weight",
                          f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"))
        rules += _attention_rules(f"{ours}attention.", f"{theirs}0.SelfAttention.")
        rules.append(Rule(f"{ours}attention_norm.weight", f"{theirs}0.layer_norm.weight"))
        if stack == "decoder":
            rules += _attention_rules(f"{ours}cross_attention.", f"{theirs}1.EncDecAttention.")
            rules.append(Rule(f"{ours}cross_attention_norm.weight",
                              f"{theirs}1.layer_norm.weight"))
        rules += _feed_forward_rules(ours, f"{theirs}{ffn_at}.", gated)
        rules.append(Rule(f"{ours}ffn_norm.weight", f"{theirs}{ffn_at}.layer_norm.weight"))
        rules.append(Rule(f"{stack}.final_norm.weight", f"{stack}.final_layer_norm.weight"))
    return rules


def lm_rules(config: TransformerConfig) -> list[Rule]:
    """``lm_head.weight``: absent from the file when tied (v1.0), its own tensor in v1.1."""
    return [Rule("heads.seq2seq-lm.decoder.weight", "lm_head.weight",
                 optional=config.tie_word_embeddings)]


def _size(hidden: int, layers: int, heads: int, ffn: int, **more: Any) -> dict[str, Any]:
    return dict(hidden_size=hidden, num_hidden_layers=layers, num_decoder_layers=layers,
                num_attention_heads=heads, head_dim=64, intermediate_size=ffn, **more)


FAMILY = FamilySpec(
    model_type="t5",
    display_name="T5",
    base_prefix="",
    shape=dict(position_embedding="relative", type_vocab_size=0,
               norm_type="rmsnorm", pre_norm=True, embedding_norm=False, final_norm=True,
               attention_bias=False, mlp_bias=False, attention_scale=1.0, causal=False,
               scale_embedding=False, share_embeddings=True),
    defaults=dict(is_encoder_decoder=True, vocab_size=32128, hidden_act="relu", ffn_type="mlp", norm_eps=1e-6,
                  pad_token_id=0, eos_token_id=1, bos_token_id=None, tie_word_embeddings=True,
                  hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                  max_position_embeddings=512,
                  extra={"decoder_start_token_id": 0, "scale_decoder_outputs": True,
                         "pad_row_trains": True}),
    sizes={"tiny": _size(128, 2, 2, 512), "mini": _size(256, 4, 4, 1024),
           "small": _size(512, 6, 8, 2048), "base": _size(768, 12, 12, 3072),
           "v1.1-small": _size(512, 8, 6, 1024, ffn_type="glu", hidden_act="gelu_new",
                               tie_word_embeddings=False, hidden_dropout_prob=0.0,
                               attention_probs_dropout_prob=0.0,
                               extra={"decoder_start_token_id": 0,
                                      "scale_decoder_outputs": False,
                                      "pad_row_trains": True})},
    hf_names={"vocab_size": "vocab_size", "d_model": "hidden_size", "d_kv": "head_dim",
              "d_ff": "intermediate_size", "num_layers": "num_hidden_layers",
              "num_decoder_layers": "num_decoder_layers", "num_heads": "num_attention_heads",
              "relative_attention_num_buckets": "relative_attention_num_buckets",
              "relative_attention_max_distance": "relative_attention_max_distance",
              "dropout_rate": "hidden_dropout_prob", "layer_norm_epsilon": "norm_eps",
              "pad_token_id": "pad_token_id", "eos_token_id": "eos_token_id",
              "tie_word_embeddings": "tie_word_embeddings",
              "decoder_start_token_id": "extra.decoder_start_token_id"},
    hf_defaults=dict(relative_attention_max_distance=128, relative_attention_num_buckets=32),
    required=("hidden_size", "head_dim", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "vocab_size"),
    from_hf=from_hf,
    to_hf=to_hf,
    base_rules=base_rules,
    head_rules={"seq2seq-lm": lm_rules},
    architectures={"T5Model": (), "T5ForConditionalGeneration": ("seq2seq-lm",)},
    encoder_class="T5EncoderModel",
)
