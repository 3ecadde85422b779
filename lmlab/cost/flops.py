"""Analytic FLOP counts of a Transformer from its :class:`TransformerConfig`.

Matrix products only, 2 FLOPs per multiply-add, training = 3 x forward, attention scores in
full (``causal_attention="half"`` halves them for causal models): the conventions of
``torch.utils.flop_counter``, so the two agree exactly. The per-component formulas, and how
pruned heads and low-rank maps are counted, are in docs/cost.md ("FLOP conventions").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lmlab.utils.checks import check_at_least, check_choice
from lmlab.utils.errors import LmlabError

Head = Literal["mlm", "clm", "emd", "plm", "none"]
CausalCounting = Literal["full", "half"]

_HEADS = ("mlm", "clm", "emd", "plm", "none")


@dataclass(frozen=True)
class FlopBreakdown:
    """FLOPs per token of one pass (training or forward only), split by where they are spent."""

    embedding_projection: float
    attention_projections: float
    attention_scores: float
    ffn: float
    head_transform: float
    output_projection: float
    seq_len: int
    training: bool
    mask_decoder: float = 0.0  # DeBERTa's enhanced mask decoder: its passes of the last layer
    query_stream: float = 0.0  # XLNet's query stream (the plm head's inputs)

    @property
    def total(self) -> float:
        """All FLOPs per token."""
        return sum(self.parts().values())

    def parts(self) -> dict[str, float]:
        """The components by name (FLOPs per token)."""
        return {
            "embedding projection": self.embedding_projection,
            "attention projections": self.attention_projections,
            "attention scores": self.attention_scores,
            "feed-forward": self.ffn,
            "head transform": self.head_transform,
            "output projection": self.output_projection,
        } | ({"enhanced mask decoder": self.mask_decoder} if self.mask_decoder else {}) \
            | ({"query stream": self.query_stream} if self.query_stream else {})

    def to_markdown(self) -> str:
        """A table: component, FLOPs per token, share of the total."""
        return parts_markdown(self.parts(), self.training, f"sequence length {self.seq_len}")


def counting_note(config) -> str:
    """What the FLOP count of ``config``'s model leaves in or out, for reports: a recurrent
    config says so itself (``flop_counting``); a Transformer's counts attention in full, a
    windowed layer's by its band."""
    windows = getattr(config, "attention_window", None) or 0  # a recurrent config has none
    if any(windows) if isinstance(windows, list) else windows:
        return "attention counted in full, windowed layers by their band"
    if getattr(config, "block_sparse", None):
        return "attention counted by the blocks BigBird's pattern computes (in full when short)"
    return getattr(config, "flop_counting", "attention counted in full")


def parts_markdown(parts: dict[str, float], training: bool, where: str) -> str:
    """FLOPs per token by component as a table (component, FLOPs/token, share of the total),
    under a heading naming the pass and ``where`` (e.g. the sequence length)."""
    kind = "training (forward + backward)" if training else "forward"
    total = sum(parts.values())
    lines = [f"FLOPs per token, {kind}, {where}:", "",
             "| component | FLOPs/token | share |", "|---|---:|---:|"]
    for name, value in parts.items():
        lines.append(f"| {name} | {value:,.0f} | {100 * value / (total or 1.0):.1f}% |")
    lines.append(f"| **total** | **{total:,.0f}** | 100% |")
    return "\n".join(lines)


def flops_breakdown(config, seq_len: int, training: bool = True, head: Head = "mlm",
                    sparse_prediction_fraction: float | None = None,
                    causal_attention: CausalCounting = "full",
                    global_tokens: int = 0) -> FlopBreakdown:
    """FLOPs per token of a :class:`~lmlab.models.config.TransformerConfig` at ``seq_len``, by
    component: training (x3) or forward only, through the ``head`` ("mlm": transform and
    decoder, "clm": decoder, "emd": DeBERTa's enhanced mask decoder then "mlm", "none") on
    ``sparse_prediction_fraction`` passes per position (None: each position once), dense
    attention scores counted ``causal_attention`` ("full" or Kaplan et al.'s "half"), windowed
    layers by the band their blocks compute plus ``global_tokens`` per sequence; docs/cost.md,
    "FLOP conventions"."""
    if seq_len < 1:
        raise LmlabError(f"seq_len must be at least 1, got {seq_len}", "pass a positive length")
    check_choice(head, _HEADS, "head", "prediction head")
    # full: what dense kernels compute; half: Kaplan et al. (2020)
    check_choice(causal_attention, ("full", "half"), "causal_attention", "attention counting")
    fraction = 1.0 if sparse_prediction_fraction is None else float(sparse_prediction_fraction)
    if not fraction > 0.0:  # above 1 where the head runs twice on some tokens (distillation)
        raise LmlabError(f"sparse_prediction_fraction must be positive, got {fraction}",
                         "pass e.g. 0.15 for the masked positions only, or None for all")
    if getattr(config, "add_cross_attention", False) or getattr(config, "is_encoder_decoder",
                                                                 False):
        raise LmlabError("an encoder-decoder's FLOPs depend on its source and target lengths, "
                         "not on one sequence length", "use seq2seq_step_flops")

    h = config.hidden_size
    layers = config.num_hidden_layers
    q = config.num_attention_heads * config.head_dim
    kv = config.num_key_value_heads * config.head_dim
    f = config.intermediate_size
    e = config.input_embedding_size
    v = config.vocab_size

    check_at_least(global_tokens, 0, "global_tokens")
    pruned = config.extra.get("attention_heads_per_layer")
    # each layer's query width: heads removed unevenly (lmlab.compress.heads) keep their k, v
    widths = [int(n) * config.head_dim for n in pruned] if pruned else [q] * layers
    q_all = sum(widths)
    kv_all = q_all if pruned else layers * kv
    embedding_projection = 2.0 * e * h if e != h else 0.0
    attention_projections = 2.0 * h * q_all + 2.0 * 2 * h * kv_all + 2.0 * q_all * h
    scores = 0.0
    for index, width in enumerate(widths):
        window = config.layer_window(index)
        if window:
            layer_scores, global_maps = _window_scores(config, window, seq_len, global_tokens)
            scores += layer_scores * width
            attention_projections += global_maps * h * width
        elif config.block_sparse:
            scores += _block_sparse_scores(seq_len, **config.block_sparse) * width
        else:
            dense = 4.0 * seq_len * width
            scores += dense / 2 if config.causal and causal_attention == "half" else dense
    ffn_layer = 2.0 * h * f * (3 if config.ffn_type == "glu" else 2)
    ffn = layers * ffn_layer
    if config.extra.get("low_rank"):  # factorised maps (lmlab.compress.lowrank): 2 r (in + out)
        from lmlab.models.variants import factorised_shapes

        uses = layers if config.share_layers else 1  # ALBERT's one layer runs L times
        for block, fan_in, fan_out, rank in factorised_shapes(config):
            saved = uses * 2.0 * (fan_in * fan_out - rank * (fan_in + fan_out))
            if block == "attention":
                attention_projections -= saved
            else:
                ffn -= saved
    query_stream = 0.0
    if config.family == "xlnet":
        scores, query_stream = _xlnet_streams(config, seq_len, q_all, scores, ffn_layer,
                                              fraction if head == "plm" else 0.0)
    mask_decoder = 0.0
    if head == "emd":  # the last layer again per step, queries and keys over all tokens
        last = widths[-1]
        last_kv = last if pruned else kv
        mask_decoder = int(config.extra.get("emd_layers", 2)) * (
            2.0 * h * last + 4.0 * h * last_kv + 2.0 * last * h + 4.0 * seq_len * last + ffn_layer)
    if head in ("mlm", "emd"):
        head_transform = 2.0 * h * e * fraction
        output_projection = 2.0 * e * v * fraction
    elif head in ("clm", "plm"):
        head_transform = 0.0
        output_projection = 2.0 * h * v * fraction
    else:
        head_transform = output_projection = 0.0

    scale = 3.0 if training else 1.0
    return FlopBreakdown(
        embedding_projection=scale * embedding_projection,
        attention_projections=scale * attention_projections,
        attention_scores=scale * scores,
        ffn=scale * ffn,
        head_transform=scale * head_transform,
        output_projection=scale * output_projection,
        seq_len=int(seq_len),
        training=training,
        mask_decoder=scale * mask_decoder,
        query_stream=scale * query_stream,
    )


def _xlnet_streams(config, seq_len: int, q_all: float, scores: float, ffn_layer: float,
                   fraction: float) -> tuple[float, float]:
    """XLNet (lmlab/models/xlnet.py), per token: the position and segment terms beside the
    content scores (R = T + T distances, T + 1 causal); with ``fraction`` > 0 the query stream:
    its maps and feed-forward at those rows, the moves to and from positions
    (``target_mapping``), its attention at every position. The distance table's map runs once
    per batch (2 R H q a layer, whatever the batch size), so no token is charged for it."""
    rows = seq_len + (seq_len if config.extra.get("attn_type", "bi") == "bi" else 1)
    relative = 2.0 * rows * q_all + 4.0 * q_all  # q . r over R distances, q . seg_embed
    query = 0.0
    if fraction:
        query = fraction * (4.0 * config.hidden_size * q_all + 4.0 * seq_len * q_all
                            + config.num_hidden_layers * ffn_layer) \
            + 4.0 * seq_len * q_all + relative
    return scores + relative, query


def _window_scores(config, window: int, seq_len: int, global_tokens: int
                   ) -> tuple[float, float]:
    """A windowed layer's (score FLOPs per token and query dimension, global maps per token):
    the blocks of b queries each score b + reach keys and the G global keys, QK and PV
    (``lmlab.models.core.local_attention``; the length padded to whole blocks); the G global
    rows score every key; Longformer's three global maps (``query_global`` ...) run over every
    token once there are global tokens."""
    from lmlab.models.core.local_attention import window_reach

    before, after = window_reach(window, config.causal)
    block = max(before, after, 1)
    rows = -(-seq_len // block) * block
    span = before + block + after
    per_sequence = 4.0 * rows * (span + global_tokens) + 4.0 * global_tokens * seq_len
    maps = 3 * 2.0 if global_tokens and config.extra.get("global_projections") else 0.0
    return per_sequence / seq_len, maps


def _block_sparse_scores(seq_len: int, block_size: int, num_random_blocks: int) -> float:
    """BigBird's score FLOPs per token and query dimension (``lmlab.models.core.block_sparse``;
    the length padded to whole blocks): the two global blocks' rows score every key, each other
    block's rows its 5 + r gathered blocks, QK and PV; dense below the sparse threshold."""
    from lmlab.models.core.block_sparse import sparse_applies

    if not sparse_applies(seq_len, block_size, num_random_blocks):
        return 4.0 * seq_len
    b, blocks = block_size, -(-seq_len // block_size)
    rows_keys = 2 * b * blocks * b + (blocks - 2) * b * (5 + num_random_blocks) * b
    return 4.0 * rows_keys / seq_len


def flops_per_token(config, seq_len: int, training: bool = True, head: Head = "mlm",
                    sparse_prediction_fraction: float | None = None,
                    causal_attention: CausalCounting = "full", global_tokens: int = 0) -> float:
    """Total FLOPs per token; see :func:`flops_breakdown` for the arguments. A config that counts
    its own (the recurrent models' :class:`~lmlab.models.rnn.config.RecurrentConfig`) does."""
    if hasattr(config, "flops_per_token"):
        return config.flops_per_token(seq_len, training=training, head=head,
                                      sparse_prediction_fraction=sparse_prediction_fraction)
    return flops_breakdown(config, seq_len, training, head, sparse_prediction_fraction,
                           causal_attention, global_tokens).total


def seq2seq_step_flops(config, source_tokens: int, source_len: int, target_tokens: int,
                       target_len: int, training: bool = True,
                       causal_attention: CausalCounting = "full") -> float:
    """FLOPs of one step of an encoder-decoder (T5, BART, Marian) on a batch of
    ``source_tokens`` and ``target_tokens`` tokens whose attention spans the (padded)
    ``source_len`` and ``target_len``: the encoder stack per source token, the decoder stack
    with its head per target token, and the cross-attention (docs/cost.md, "Encoder-decoders").
    """
    import dataclasses

    from lmlab.models.seq2seq import stack_configs

    encoder, decoder = stack_configs(config)
    # factorised maps (lmlab.compress.lowrank) are named "encoder.layers.i..." or
    # "decoder.layers.i...": each stack counts its own, the cross-attention's come off below
    record = config.extra.get("low_rank") or {}
    encoder = _own_low_rank(encoder, record, "encoder")
    self_decoder = _own_low_rank(dataclasses.replace(decoder, add_cross_attention=False),
                                 record, "decoder")
    encoder_per_token = flops_per_token(encoder, source_len, training, head="none")
    decoder_per_token = flops_per_token(self_decoder, target_len, training, head="clm",
                                        causal_attention=causal_attention)
    h = decoder.hidden_size
    q = decoder.num_attention_heads * decoder.head_dim
    kv = decoder.num_key_value_heads * decoder.head_dim
    layers = decoder.num_hidden_layers
    scale = 3.0 if training else 1.0
    cross_per_target = layers * (2.0 * h * q + 2.0 * q * h + 4.0 * source_len * q)
    cross_per_source = layers * 2.0 * 2 * h * kv
    for name, rank in record.items():  # a factorised cross-attention map: 2 r (in + out)
        if ".cross_attention." not in name:
            continue
        proj = name.rsplit(".", 1)[-1]
        fan_in, fan_out = {"q_proj": (h, q), "o_proj": (q, h), "k_proj": (h, kv),
                           "v_proj": (h, kv)}[proj]
        saved = 2.0 * (fan_in * fan_out - int(rank) * (fan_in + fan_out))
        if proj in ("q_proj", "o_proj"):  # per target token
            cross_per_target -= saved
        else:  # keys and values of the encoder's output: per source token
            cross_per_source -= saved
    return (source_tokens * (encoder_per_token + scale * cross_per_source)
            + target_tokens * (decoder_per_token + scale * cross_per_target))


def _own_low_rank(config, record: dict[str, int], stack: str):
    """``config`` with only ``stack``'s own factorised maps in ``extra["low_rank"]`` (not the
    other stack's, nor the cross-attention's)."""
    import dataclasses
    import re

    own = {name: rank for name, rank in record.items()
           if re.search(rf"(^|\.){stack}\.layers\.", name) and ".cross_attention." not in name}
    return dataclasses.replace(config, extra={**config.extra, "low_rank": own})


def parse_seq_len_schedule(spec: str | int) -> list[tuple[int, float]]:
    """Parse ``"512"`` or ``"128:0.9,512:0.1"`` into [(seq_len, fraction of steps), ...].

    Fractions are of *steps* (sequences), the way BERT states its schedule ("128 tokens for
    90% of the steps"); they must sum to 1.
    """
    text = str(spec).strip()
    schedule: list[tuple[int, float]] = []
    try:
        for part in text.split(","):
            if ":" in part:
                length, share = part.split(":", 1)
                schedule.append((int(length), float(share)))
            else:
                schedule.append((int(part), 1.0))
    except ValueError as error:
        raise LmlabError(f"cannot read sequence-length schedule {text!r} ({error})",
                         "write a length (512) or lengths with step fractions (128:0.9,512:0.1)"
                         ) from None
    if any(length < 1 or share <= 0 for length, share in schedule):
        raise LmlabError(f"sequence lengths and fractions must be positive in {text!r}",
                         "write e.g. 128:0.9,512:0.1")
    total = sum(share for _, share in schedule)
    if abs(total - 1.0) > 1e-6:
        raise LmlabError(f"step fractions in {text!r} sum to {total:g}, not 1",
                         "make the fractions add up to 1, e.g. 128:0.9,512:0.1")
    return schedule


def schedule_flops_per_token(config, schedule: list[tuple[int, float]], training: bool = True,
                             head: Head = "mlm", sparse_prediction_fraction: float | None = None,
                             causal_attention: CausalCounting = "full",
                             global_tokens: int = 0) -> float:
    """Token-weighted FLOPs per token over a schedule of (seq_len, fraction of steps).

    With a fixed number of sequences per step, a step at length S holds S tokens per
    sequence, so each length's weight is ``fraction x S``.
    """
    weights = [share * length for length, share in schedule]
    total = sum(weights)
    return sum(
        weight / total * flops_per_token(config, length, training, head,
                                         sparse_prediction_fraction, causal_attention,
                                         global_tokens)
        for (length, _), weight in zip(schedule, weights)
    )
