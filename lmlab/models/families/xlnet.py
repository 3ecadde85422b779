"""XLNet (Yang et al. 2019): two-stream relative attention with segment recurrence
(lmlab/models/xlnet.py, docs/xlnet.md); its permutation LM is the ``plm`` objective.

Presets: ``base`` and ``large`` (xlnet/xlnet-base-cased, xlnet/xlnet-large-cased shapes),
``tiny`` (2 x 128) for experiments.
"""

from __future__ import annotations

from typing import Any

from lmlab.models.config import TransformerConfig
from lmlab.models.families import FamilySpec, Rule, paired_rules, stack_size
from lmlab.utils.errors import LmlabError

#: post-norm, bias-free attention maps, relative positions only (no length limit)
SHAPE: dict[str, Any] = dict(
    position_embedding="relative", norm_type="layernorm", pre_norm=False, embedding_norm=False,
    final_norm=False, ffn_type="mlp", causal=False, attention_bias=False, mlp_bias=True)
#: XLNetConfig's settings kept in ``extra`` (transformers' defaults; mem_len: none = keep all)
SETTINGS = dict(attn_type="bi", bi_data=False, clamp_len=-1, same_length=False,
                use_mems_eval=True, use_mems_train=False, summary_activation="tanh",
                summary_last_dropout=0.1, start_n_top=5, end_n_top=5)
HF_NAMES = {name: name for name in (
    "vocab_size", "initializer_range", "pad_token_id", "bos_token_id", "eos_token_id",
    "tie_word_embeddings")} | {
    "d_model": "hidden_size", "n_layer": "num_hidden_layers", "n_head": "num_attention_heads",
    "d_inner": "intermediate_size", "ff_activation": "hidden_act", "layer_norm_eps": "norm_eps",
    "dropout": "hidden_dropout_prob"} | {
    name: f"extra.{name}" for name in (*SETTINGS, "mem_len", "reuse_len")}
_ATTENTION = "transformer.layers.{i}.attention."
#: lmlab.models.task_heads.BeamQuestionAnsweringHead's modules and XLNetForQuestionAnswering's
BEAM_QA = [("start", "start_logits.dense"), ("end_hidden", "end_logits.dense_0"),
           ("end_norm", "end_logits.LayerNorm"), ("end", "end_logits.dense_1"),
           ("answer_hidden", "answer_class.dense_0")]


def check_from_hf(hf: dict[str, Any], values: dict[str, Any]) -> None:
    """One dropout for states and attention; the summary lmlab builds (a projection of the
    last token) or a refusal."""
    values["attention_probs_dropout_prob"] = values.get("hidden_dropout_prob", 0.1)
    if hf.get("summary_type", "last") != "last" or not hf.get("summary_use_proj", True):
        raise LmlabError(f"this XLNet config.json summarises a sequence by "
                         f"{hf.get('summary_type')!r} (summary_use_proj "
                         f"{hf.get('summary_use_proj')})", "lmlab builds XLNet's own summary: "
                         "summary_type 'last' with summary_use_proj true")


def check_to_hf(config: TransformerConfig, hf: dict[str, Any]) -> None:
    hf["d_head"] = config.head_dim


def xlnet_rules(config: TransformerConfig) -> list[Rule]:
    """The token table, the query stream's ``mask_emb``, each layer's (H, nh, hd) maps and
    relative biases, its norms and feed-forward."""
    theirs = "layer.{i}.rel_attn."
    rules = [Rule("transformer.word_embeddings.weight", "word_embedding.weight"),
             Rule("transformer.mask_emb", "mask_emb")]
    rules += [Rule(f"{_ATTENTION}{name}_proj.weight", f"{theirs}{name}", head_axes=True,
                   transpose=name != "o") for name in ("q", "k", "v", "o", "r")]
    rules += [Rule(f"{_ATTENTION}{name}", f"{theirs}{name}")
              for name in ("r_w_bias", "r_r_bias", "r_s_bias", "seg_embed")]
    rules += paired_rules("transformer.layers.{i}.", "layer.{i}.", [
        ("attention.norm", "rel_attn.layer_norm"), ("feed_forward.up_proj", "ff.layer_1"),
        ("feed_forward.down_proj", "ff.layer_2"), ("ffn_norm", "ff.layer_norm")])
    return rules


FAMILY = FamilySpec(
    model_type="xlnet",
    display_name="XLNet",
    base_prefix="transformer",
    shape=SHAPE,
    defaults=dict(vocab_size=32000, hidden_act="gelu", norm_eps=1e-12, type_vocab_size=2,
                  hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                  tie_word_embeddings=True, pad_token_id=5, bos_token_id=1, eos_token_id=2,
                  extra=dict(SETTINGS)),
    sizes={"tiny": stack_size(128, 2), "base": stack_size(768, 12),
           "large": stack_size(1024, 24)},
    hf_names=HF_NAMES,
    hf_constants={"summary_type": "last", "summary_use_proj": True},
    required=("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "intermediate_size"),
    from_hf=check_from_hf,
    to_hf=check_to_hf,
    base_rules=xlnet_rules,
    head_rules={"plm": lambda config: [
        Rule("heads.plm.decoder.weight", "lm_loss.weight", optional=config.tie_word_embeddings),
        Rule("heads.plm.decoder.bias", "lm_loss.bias")],
        "question-answering-beam": lambda config: paired_rules(
            "heads.question-answering-beam.", "", BEAM_QA) + [
            Rule("heads.question-answering-beam.answer.weight", "answer_class.dense_1.weight")]},
    # span QA is XLNetForQuestionAnsweringSimple; XLNetForQuestionAnswering is the beam head
    architectures={"XLNetModel": (), "XLNetLMHeadModel": ("plm",),
                   "XLNetForQuestionAnsweringSimple": ("question-answering",),
                   "XLNetForQuestionAnswering": ("question-answering-beam",)},
    task_heads={"sequence-classification": "summary-last", "multiple-choice": "summary-last",
                "token-classification": "tokens", "question-answering": "span"},
)
