"""One configuration for every Transformer family lmlab builds; field names follow Hugging Face's
where one exists, so mapping a config.json is mostly renaming.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lmlab.utils.errors import LmlabError

PositionKind = Literal["learned", "sinusoidal", "rotary", "relative", "none"]
NormKind = Literal["layernorm", "rmsnorm"]
FFNKind = Literal["mlp", "glu"]


def config_fields(cls: type, values: dict[str, Any], what: str = "config") -> dict[str, Any]:
    """``values`` (a config.json's) as keyword arguments of config dataclass ``cls``: unknown
    fields refused, ``extra["id2label"]``'s JSON string keys back to ints."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise LmlabError(f"unknown {what} fields: {', '.join(unknown)}",
                         f"valid fields are: {', '.join(sorted(known))}")
    values = dict(values)
    if "extra" in values:
        extra = dict(values["extra"] or {})
        if "id2label" in extra:
            extra["id2label"] = {int(k): str(v) for k, v in extra["id2label"].items()}
        values["extra"] = extra
    return values


@dataclass
class TransformerConfig:
    """Hyperparameters of a Transformer stack (or an encoder-decoder pair); the defaults are
    BERT-base's, ``family`` names the checkpoint family for interop."""

    family: str = "bert"
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    num_key_value_heads: int | None = None  # grouped-query attention; None = same as heads
    head_dim: int | None = None  # None = hidden_size // num_attention_heads
    intermediate_size: int = 3072
    hidden_act: str = "gelu"  # gelu | gelu_new (tanh approx.) | relu | silu
    ffn_type: FFNKind = "mlp"  # mlp: act(xW1)W2 ; glu: (act(xWg) * xWu)W2 (SwiGLU/GeGLU)
    max_position_embeddings: int = 512
    type_vocab_size: int = 2  # 0 = no segment embeddings
    position_embedding: PositionKind = "learned"
    position_offset: int = 0  # RoBERTa numbers positions from padding_idx + 1
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # linear | dynamic | yarn | llama3 (core/rope.py)
    embedding_size: int | None = None  # ALBERT/ELECTRA factorised embeddings (E != H)
    scale_embedding: bool = False  # token embeddings times sqrt(hidden) (Vaswani, Marian)
    norm_type: NormKind = "layernorm"
    norm_eps: float = 1e-12
    pre_norm: bool = False  # False: BERT's post-norm; True: GPT-2/Llama pre-norm
    embedding_norm: bool = True  # LayerNorm right after the embeddings (BERT family)
    final_norm: bool = False  # norm after the last layer (pre-norm stacks)
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    share_layers: bool = False  # ALBERT: one set of layer weights reused by every layer
    attention_bias: bool = True
    attention_out_bias: bool | None = None  # the output map's bias; None = attention_bias
    mlp_bias: bool = True
    causal: bool = False  # decoder: each position attends only to itself and the past
    add_cross_attention: bool = False  # encoder-decoder decoders (T5, BART, Transformer)
    is_encoder_decoder: bool = False  # this config describes an encoder and a decoder
    num_decoder_layers: int | None = None  # encoder-decoder: None = num_hidden_layers
    share_embeddings: bool = True  # encoder-decoder: one token table for source and target
    relative_attention_num_buckets: int = 32  # T5's relative position buckets
    relative_attention_max_distance: int = 128
    attention_scale: float | None = None  # None = 1/sqrt(head_dim * (1 + len(pos_att_type)))
    # DeBERTa's disentangled attention (core/disentangled.py): its terms "c2p" and/or "p2c",
    # the relative distances (-1: max_position_embeddings), v2's log buckets (-1: none), the
    # content maps reused for positions, the table's norm ("layer_norm" or "none")
    relative_attention: bool = False
    pos_att_type: list[str] | None = None
    max_relative_positions: int = -1
    position_buckets: int = -1
    share_att_key: bool = False
    norm_rel_ebd: str = "none"
    # sliding-window attention (core/local_attention.py): keys seen per query, one value or one
    # per layer, 0 = dense; bidirectional: window/2 each side (even), causal: window keys back
    attention_window: int | list[int] | None = None
    # BigBird's block-sparse attention in every layer (core/block_sparse.py): None = dense, else
    # {"block_size": b, "num_random_blocks": r}; inputs too short for the pattern attend densely
    block_sparse: dict[str, int] | None = None
    tie_word_embeddings: bool = True
    initializer_range: float = 0.02
    pad_token_id: int | None = 0
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # family-specific values, kept verbatim

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise LmlabError(
                    f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                    f"{self.num_attention_heads}",
                    "choose a head count that divides the hidden size, or set head_dim",
                )
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.rope_scaling:
            from lmlab.models.core.rope import check_rope_scaling

            if self.position_embedding != "rotary":
                raise LmlabError(f"rope_scaling with {self.position_embedding!r} positions",
                                 "RoPE scaling needs position_embedding='rotary'")
            self.rope_scaling = check_rope_scaling(self.rope_scaling, self.max_position_embeddings)
        if self.pos_att_type is not None:
            from lmlab.utils.checks import check_choice

            self.pos_att_type = [check_choice(t, ("c2p", "p2c"), "pos_att_type entry",
                                              "pos_att_type") for t in self.pos_att_type]
        if self.is_encoder_decoder and self.num_decoder_layers is None:
            self.num_decoder_layers = self.num_hidden_layers
        if self.attention_window is not None:
            self._check_attention_window()
        if self.block_sparse is not None:
            from lmlab.models.core.block_sparse import check_block_sparse

            self.block_sparse = check_block_sparse(self)
        if self.num_attention_heads % self.num_key_value_heads:
            raise LmlabError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}",
                "use a key/value head count that divides the query head count",
            )

    def _check_attention_window(self) -> None:
        windows = self.attention_window
        per_layer = isinstance(windows, list)
        if per_layer and len(windows) != self.num_hidden_layers:
            raise LmlabError(f"attention_window has {len(windows)} entries for "
                             f"{self.num_hidden_layers} layers", "give one window per layer")
        for w in windows if per_layer else [windows]:
            if isinstance(w, bool) or not isinstance(w, int) or w < 0:
                raise LmlabError(f"attention_window entry {w!r} is not a whole number >= 0",
                                 "give the keys each query sees (0: dense attention)")
            if w % 2 and not self.causal:
                raise LmlabError(f"attention_window {w} is odd in a bidirectional stack",
                                 "use an even window: window/2 keys on each side")
        if self.relative_attention or self.position_embedding == "relative" \
                or self.is_encoder_decoder or (per_layer and self.share_layers
                                              and len(set(windows)) > 1):
            raise LmlabError("attention_window with relative position biases, an encoder-decoder "
                             "or shared layers of different windows is not supported",
                             "use learned, sinusoidal or rotary positions in one stack")

    def layer_window(self, index: int) -> int:
        """Layer ``index``'s attention window (0: dense)."""
        windows = self.attention_window or 0
        return windows[index] if isinstance(windows, list) else windows

    @property
    def input_embedding_size(self) -> int:
        """Width of the token embedding table (E in ALBERT; H otherwise)."""
        return self.embedding_size or self.hidden_size

    @property
    def relative_max_distance(self) -> int:
        """DeBERTa's largest relative distance (``max_relative_positions``, else the context)."""
        return self.max_relative_positions if self.max_relative_positions > 0 \
            else self.max_position_embeddings

    @property
    def relative_span(self) -> int:
        """Half the rows of DeBERTa's distance table: the buckets, else the largest distance."""
        return self.position_buckets if self.position_buckets > 0 else self.relative_max_distance

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TransformerConfig:
        return cls(**config_fields(cls, values))

    def save(self, path: str | Path) -> None:
        from lmlab.utils.io import atomic_write_json

        atomic_write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> TransformerConfig:
        with open(path, encoding="utf-8") as handle:
            return cls.from_dict(json.load(handle))

    def num_parameters(self, include_embeddings: bool = True) -> int:
        """Parameter count computed from the shapes (no model needed)."""
        h, e, f = self.hidden_size, self.input_embedding_size, self.intermediate_size
        q = self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        ab, mb = int(self.attention_bias), int(self.mlp_bias)
        norm = 2 * h if self.norm_type == "layernorm" else h
        kb = ab * int(self.extra.get("key_bias", True))  # DeBERTa v1's keys have no bias
        ob = int(self.attention_bias if self.attention_out_bias is None else self.attention_out_bias)
        attn = h * q + q * ab + 2 * h * kv + kv * (ab + kb) + q * h + h * ob
        ffn_in = 2 if self.ffn_type == "glu" else 1
        ffn = ffn_in * (h * f + f * mb) + f * h + h * mb
        layer = attn + ffn + 2 * norm
        if self.family == "xlnet":  # q, k, v, o, r maps, three biases and the segment table
            layer = 5 * h * q + 5 * q + ffn + 2 * norm
            return layer * self.num_hidden_layers + (self.vocab_size + 1) * h * include_embeddings
        layers = layer * (1 if self.share_layers else self.num_hidden_layers)
        if self.extra.get("global_projections"):  # Longformer: q, k, v maps of global tokens
            layers += 3 * (h * q + q * ab) * sum(map(bool, map(self.layer_window,
                                                             range(self.num_hidden_layers))))
        for count in self.extra.get("attention_heads_per_layer", ()):  # pruned heads' weights
            layers -= (self.num_attention_heads - count) * self.head_dim * (4 * h + 3 * ab)
        if self.extra.get("low_rank"):  # factorised maps (lmlab.compress.lowrank): r (in + out)
            from lmlab.models.variants import factorised_shapes

            layers -= sum(i * o - r * (i + o) for _, i, o, r in factorised_shapes(self))
        stacks = 2 if self.is_encoder_decoder else 1  # each stack has its own norms, positions
        total = layers + (norm if self.final_norm else 0) * stacks
        if self.is_encoder_decoder:  # decoder layers: a cross-attention and its norm more
            total += (layer + attn + norm) * self.num_decoder_layers
        if self.position_embedding == "relative":  # one bucket table per stack
            total += stacks * self.relative_attention_num_buckets * self.num_attention_heads
        if self.relative_attention:  # the distance table (and norm), per-layer position maps
            total += 2 * self.relative_span * h + (norm if "layer_norm" in self.norm_rel_ebd else 0)
            maps = [] if self.share_att_key else self.pos_att_type or []  # c2p's key map: kb
            total += sum(h * q + (kb if t == "c2p" else 1) * q for t in maps) * self.num_hidden_layers
        if self.extra.get("num_hash_buckets"):  # CANINE: two character layers, convolutions
            rate = self.extra.get("downsampling_rate", 4)
            kernel = self.extra.get("upsampling_kernel_size", 4)
            total += 2 * layer + (rate * h + 2 * kernel * h + 2) * h + 4 * h
            if include_embeddings:  # hash shards (H columns in all), positions, types, norm
                total += (2 * self.extra["num_hash_buckets"] + self.type_vocab_size + 2) * h
            return total
        if include_embeddings and self.extra.get("patch_size"):  # ViT: core/image_embeddings.py
            from lmlab.models.core.image_embeddings import pair, patch_grid

            rows, columns = patch_grid(self)
            kernel = int(self.extra.get("num_channels", 3)) * pair(self.extra["patch_size"])[0] \
                * pair(self.extra["patch_size"])[1]
            return total + (kernel + 1) * h + (2 + rows * columns) * h  # patches, [CLS], positions
        if include_embeddings:
            emb = self.vocab_size * e
            if self.is_encoder_decoder and not self.share_embeddings:
                emb += self.vocab_size * e  # the target side's own table
            if self.position_embedding == "learned":
                emb += stacks * self.max_position_embeddings * e  # table rows, offset included
            emb += self.type_vocab_size * e
            if self.embedding_norm:
                emb += stacks * (2 * e if self.norm_type == "layernorm" else e)
            if e != h:
                emb += e * h + h
            total += emb
        return total
