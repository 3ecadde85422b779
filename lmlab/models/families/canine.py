"""CANINE (Clark et al. 2022): characters hashed, downsampled to a BERT-like post-norm stack,
upsampled back (lmlab/models/canine.py, docs/characters.md).

Presets: ``s`` and ``c``, google/canine-s and google/canine-c (the same 768 x 12 shape; they
differ in what pretraining predicted, subwords or characters); ``small`` for experiments.
"""

from __future__ import annotations

from lmlab.models.config import TransformerConfig
from lmlab.models.families import BERT_TASK_HEADS, FamilySpec, Rule, paired_rules, stack_size
from lmlab.models.families.bert import ENCODER_SHAPE, bert_layer_rules, layer_rules

UNICODE_SIZE = 0x110000  # every codepoint is an input id (CanineTokenizer's vocab_size)
SETTINGS = ("downsampling_rate", "upsampling_kernel_size", "num_hash_functions",
            "num_hash_buckets", "local_transformer_stride")
_SHALLOW = ("attention.self.query", "attention.self.key", "attention.self.value",
            "attention.output.dense", "attention.output.LayerNorm", "intermediate.dense",
            "output.dense", "output.LayerNorm")


def _base_rules(config: TransformerConfig) -> list[Rule]:
    hashes = int(config.extra.get("num_hash_functions", 8))
    embeddings = [Rule(f"transformer.embeddings.hash_tables.{k}.weight",
                       f"char_embeddings.HashBucketCodepointEmbedder_{k}.weight")
                  for k in range(hashes)]
    embeddings += paired_rules("transformer.embeddings.", "char_embeddings.", [
        ("position_embeddings", "char_position_embeddings"),
        ("token_type_embeddings", "token_type_embeddings")], params=("weight",))
    embeddings += paired_rules("transformer.", "", [
        ("embeddings.norm", "char_embeddings.LayerNorm"),
        ("downsample.conv", "chars_to_molecules.conv"),
        ("downsample.norm", "chars_to_molecules.LayerNorm"),
        ("upsample.conv", "projection.conv"), ("upsample.norm", "projection.LayerNorm")])
    shallow = [rule for ours, theirs in (("initial_layer", "initial_char_encoder"),
                                         ("final_layer", "final_char_encoder"))
               for rule in layer_rules(f"{theirs}.layer.0.", _SHALLOW, f"transformer.{ours}.")]
    return embeddings + shallow + bert_layer_rules()


FAMILY = FamilySpec(
    model_type="canine",
    display_name="CANINE",
    base_prefix="canine",
    shape=dict(ENCODER_SHAPE, vocab_size=UNICODE_SIZE),
    defaults=dict(hidden_act="gelu", max_position_embeddings=16384, type_vocab_size=16,
                  norm_eps=1e-12, tie_word_embeddings=False, pad_token_id=0,
                  bos_token_id=0xE000, eos_token_id=0xE001,
                  extra=dict(downsampling_rate=4, upsampling_kernel_size=4, num_hash_functions=8,
                             num_hash_buckets=16384, local_transformer_stride=128)),
    sizes={"small": stack_size(256, 4, max_position_embeddings=2048, extra=dict(
               downsampling_rate=4, upsampling_kernel_size=4, num_hash_functions=8,
               num_hash_buckets=4096, local_transformer_stride=128)),
           "s": stack_size(768, 12), "c": stack_size(768, 12)},
    hf_names={name: name for name in (
        "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
        "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob",
        "max_position_embeddings", "type_vocab_size", "initializer_range", "pad_token_id",
        "bos_token_id", "eos_token_id")} | {"layer_norm_eps": "norm_eps"} | {
        name: f"extra.{name}" for name in SETTINGS},
    hf_defaults=dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                     intermediate_size=3072),  # CanineConfig's (google/canine-s)
    base_rules=_base_rules,
    pooler_rules=paired_rules("", "", [("pooler.dense", "pooler.dense")]),
    architectures={"CanineModel": ()},
    task_heads=dict(BERT_TASK_HEADS),
)
