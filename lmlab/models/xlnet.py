"""XLNet (Yang et al. 2019): Transformer-XL's relative attention with two streams. The content
stream ``h`` is a token's usual state; the query stream ``g`` starts from one learned vector
(``mask_emb``) and sees its token's position but not its content, which a permutation LM
predicts. ``perm_mask`` (B, T, T) says which tokens each one may not see (a factorisation
order), ``target_mapping`` (B, M, T) which positions the query stream predicts; ``mems`` are the
previous segment's content states (segment recurrence). docs/xlnet.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from lmlab.models.config import TransformerConfig
from lmlab.models.core.feedforward import FeedForward
from lmlab.models.core.norms import make_norm
from lmlab.models.heads import build_head, token_cross_entropy
from lmlab.models.model import HeadedModel, init_normal
from lmlab.models.outputs import ModelOutput
from lmlab.utils.checks import check_choice
from lmlab.utils.errors import LmlabError

ATTENTION_TYPES = ("bi", "uni")  # XLNet's bidirectional attention, Transformer-XL's causal one


def relative_encoding(config: TransformerConfig, qlen: int, klen: int, batch: int,
                      device: torch.device) -> torch.Tensor:
    """Sinusoids (1 or B, R, H) of the distances klen, klen-1, ... (R = klen + qlen, or klen + 1
    causal), in float32 as transformers computes them; ``bi_data``: the first half of the batch
    forward distances, the second half reversed ones."""
    extra = config.extra
    end = -qlen if extra.get("attn_type", "bi") == "bi" else -1
    inv_freq = 1 / torch.pow(10000, torch.arange(0, config.hidden_size, 2.0, device=device)
                             / config.hidden_size)  # (H/2,)

    def table(start: int, stop: int, step: float) -> torch.Tensor:
        positions = torch.arange(start, stop, step, device=device)
        clamp = int(extra.get("clamp_len", -1))
        if clamp > 0:
            positions = positions.clamp(-clamp, clamp)
        angles = positions[:, None] * inv_freq  # (R, H/2)
        return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)[None]  # (1, R, H)

    forward = table(klen, end, -1.0)
    if not extra.get("bi_data", False):
        return forward
    if batch % 2:
        raise LmlabError(f"bi_data needs an even batch, got {batch} rows",
                         "use an even batch size, or set extra['bi_data'] false")
    backward = table(-klen, -end, 1.0)
    return torch.cat([forward.expand(batch // 2, -1, -1), backward.expand(batch // 2, -1, -1)])


class RelativeAttention(nn.Module):
    """Multi-head attention with content (``r_w_bias``), position (``r_r_bias``, relative
    sinusoids through ``r_proj``) and segment (``r_s_bias``, ``seg_embed``: same segment or not)
    terms, shared by both streams; post-norm residual."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        h, heads, dim = config.hidden_size, config.num_attention_heads, config.head_dim
        self.heads, self.head_dim, self.scale = heads, dim, dim ** -0.5
        width = heads * dim
        self.q_proj, self.k_proj, self.v_proj, self.r_proj = (
            nn.Linear(h, width, bias=False) for _ in range(4))
        self.o_proj = nn.Linear(width, h, bias=False)
        std = config.initializer_range
        self.r_w_bias, self.r_r_bias, self.r_s_bias = (
            nn.Parameter(torch.randn(heads, dim) * std) for _ in range(3))
        self.seg_embed = nn.Parameter(torch.randn(2, heads, dim) * std)
        self.norm = make_norm(config.norm_type, h, config.norm_eps)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(*x.shape[:-1], self.heads, self.head_dim)  # (..., L, H) -> (..., L, nh, hd)

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kr: torch.Tensor,
             other_segment: torch.Tensor | None, blocked: torch.Tensor | None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention of queries q (B, T, nh, hd) over keys k, v (B, K, nh, hd) at relative
        encodings kr (1|B, R, nh, hd); returns (vectors (B, T, nh, hd), probs (B, nh, T, K))."""
        length, klen = q.shape[1], k.shape[1]
        content = torch.einsum("bind,bjnd->bnij", q + self.r_w_bias, k)
        position = torch.einsum("bind,bjnd->bnij", q + self.r_r_bias, kr)  # (B, nh, T, R)
        # query i, key j sit at distance klen - r for r = length - i + j (beyond R: masked)
        shift = (torch.arange(klen, device=q.device)[None] - torch.arange(length, device=q.device)
                 [:, None] + length).clamp(max=position.shape[-1] - 1)  # (T, K)
        scores = content + position.gather(-1, shift.expand(*position.shape[:2], -1, -1))
        if other_segment is not None:
            segment = torch.einsum("bind,snd->bnis", q + self.r_s_bias, self.seg_embed)
            scores = scores + torch.where(other_segment[:, None], segment[..., 1:],
                                          segment[..., :1])  # (B, nh, T, K)
        scores = scores * self.scale
        if blocked is not None:
            scores = scores.masked_fill(blocked[:, None], torch.finfo(scores.dtype).min)
        probs = self.dropout(torch.softmax(scores, dim=-1))
        return torch.einsum("bnij,bjnd->bind", probs, v), probs

    def post(self, x: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
        out = self.o_proj(vectors.flatten(-2))  # (B, T, nh, hd) -> (B, T, H)
        return self.norm(x + self.dropout(out))

    def forward(self, h: torch.Tensor, g: torch.Tensor | None, blocked_h: torch.Tensor | None,
                blocked_g: torch.Tensor | None, encoding: torch.Tensor,
                other_segment: torch.Tensor | None, mem: torch.Tensor | None = None,
                target_mapping: torch.Tensor | None = None):
        """(h', g' or None, probs: h's, or (h's, g's))."""
        context = h if mem is None else torch.cat([mem, h], dim=1)  # (B, K, H)
        k, v = self.split(self.k_proj(context)), self.split(self.v_proj(context))
        kr = self.split(self.r_proj(encoding))
        vectors, probs = self.core(self.split(self.q_proj(h)), k, v, kr, other_segment, blocked_h)
        h_out = self.post(h, vectors)
        if g is None:
            return h_out, None, probs
        q = self.split(self.q_proj(g))  # (B, M, nh, hd)
        if target_mapping is not None:  # each prediction's query at its position
            q = torch.einsum("bmnd,bml->blnd", q, target_mapping)
        vectors, g_probs = self.core(q, k, v, kr, other_segment, blocked_g)
        if target_mapping is not None:
            vectors = torch.einsum("blnd,bml->bmnd", vectors, target_mapping)
        return h_out, self.post(g, vectors), (probs, g_probs)


class XLNetLayer(nn.Module):
    """Relative attention, then the core feed-forward (post-norm) on each stream."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.attention = RelativeAttention(config)
        self.feed_forward = FeedForward(config)
        self.ffn_norm = make_norm(config.norm_type, config.hidden_size, config.norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def ffn(self, x: torch.Tensor) -> torch.Tensor:
        return self.ffn_norm(x + self.dropout(self.feed_forward(x)))

    def forward(self, h, g, blocked_h, blocked_g, encoding, other_segment, mem=None,
                target_mapping=None):
        h, g, probs = self.attention(h, g, blocked_h, blocked_g, encoding, other_segment, mem,
                                     target_mapping)
        return self.ffn(h), None if g is None else self.ffn(g), probs


def attention_blocks(config: TransformerConfig, batch: int, qlen: int, mlen: int,
                     attention_mask: torch.Tensor | None, perm_mask: torch.Tensor | None,
                     device: torch.device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(content stream's, query stream's) blocked keys (B, T, mlen + T), True = not seen: the
    causal mask (``uni``), padding, ``perm_mask``; memory is always seen, and the content
    stream always sees its own token."""
    klen = mlen + qlen
    blocked = None
    if config.extra.get("attn_type", "bi") == "uni":
        rows, cols = torch.arange(qlen, device=device)[:, None], torch.arange(klen, device=device)
        causal = cols > rows + mlen
        if config.extra.get("same_length", False):
            causal = causal | (cols < rows)
        blocked = causal[None].expand(batch, -1, -1)
    data = None
    if attention_mask is not None:
        data = (attention_mask == 0)[:, None, :].expand(batch, qlen, qlen)
    if perm_mask is not None:
        data = (perm_mask > 0) if data is None else data | (perm_mask > 0)
    if data is not None:
        data = torch.cat([data.new_zeros(batch, qlen, mlen), data], dim=-1)  # memory: seen
        blocked = data if blocked is None else blocked | data
    if blocked is None:
        return None, None
    own = torch.arange(klen, device=device)[None] == torch.arange(qlen, device=device)[:, None] + mlen
    return blocked & ~own, blocked


class XLNetTransformer(nn.Module):
    """``word_embeddings``, ``mask_emb`` (the query stream's start), ``layers``."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        check_choice(config.extra.get("attn_type", "bi"), ATTENTION_TYPES, "attn_type",
                     "attention type")
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.mask_emb = nn.Parameter(torch.randn(1, 1, config.hidden_size)
                                     * config.initializer_range)
        self.layers = nn.ModuleList(XLNetLayer(config) for _ in range(config.num_hidden_layers))
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def cache(self, h: torch.Tensor, mem: torch.Tensor | None) -> torch.Tensor:
        """The next segment's memory of one layer: its input (the first ``reuse_len`` tokens)
        after ``mem``, the last ``mem_len`` kept (all when 0/None), without gradient."""
        reuse, keep = self.config.extra.get("reuse_len"), self.config.extra.get("mem_len")
        if reuse:
            h = h[:, :reuse]
        joined = h if mem is None else torch.cat([mem, h], dim=1)
        return (joined[:, -keep:] if keep else joined).detach()

    def forward(self, input_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None,
                perm_mask: torch.Tensor | None = None,
                target_mapping: torch.Tensor | None = None,
                mems: Sequence[torch.Tensor] | None = None, use_mems: bool = False,
                output_hidden_states: bool = False, output_attentions: bool = False,
                **ignored: Any) -> ModelOutput:
        """Last state (B, T, H), or the query stream's (B, M, H) with ``target_mapping``;
        ``mems``: each layer's new memory (B, mem, H) when ``use_mems``; ``ignored``: settings
        of the core stack (``skip_padding``: every position is computed here)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise LmlabError("pass exactly one of input_ids and inputs_embeds",
                             "XLNet reads token ids (or their embeddings)")
        x = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        batch, qlen = x.shape[:2]
        mlen = mems[0].shape[1] if mems else 0
        for name, value, shape in (("perm_mask", perm_mask, (batch, qlen, qlen)),
                                   ("target_mapping", target_mapping, (batch, None, qlen))):
            if value is not None and (value.dim() != 3 or any(
                    want not in (None, got) for want, got in zip(shape, value.shape))):
                raise LmlabError(f"{name} has shape {tuple(value.shape)} for {batch} rows of "
                                 f"{qlen} tokens", f"give {name} as (batch, "
                                 f"{'tokens' if name == 'perm_mask' else 'predictions'}, tokens)")
        blocked_h, blocked_g = attention_blocks(self.config, batch, qlen, mlen, attention_mask,
                                                perm_mask, x.device)
        h = self.dropout(x)
        g = None
        if target_mapping is not None:
            target_mapping = target_mapping.to(x.dtype)
            g = self.dropout(self.mask_emb.expand(batch, target_mapping.shape[1], -1).to(x.dtype))
        other_segment = None
        if token_type_ids is not None:  # (B, T, K): key in another segment (memory: segment 0)
            keys = torch.cat([token_type_ids.new_zeros(batch, mlen), token_type_ids], dim=1)
            other_segment = token_type_ids[:, :, None] != keys[:, None, :]
        encoding = self.dropout(relative_encoding(self.config, qlen, mlen + qlen, batch,
                                                  x.device).to(x.dtype))
        new_mems, states, probs = [], [], []
        for index, layer in enumerate(self.layers):
            mem = mems[index] if mems else None
            if use_mems:
                new_mems.append(self.cache(h, mem))
            states += [h] if g is None else [h, g]
            h, g, layer_probs = layer(h, g, blocked_h, blocked_g, encoding, other_segment, mem,
                                      target_mapping)
            probs.append(layer_probs)
        states += [h] if g is None else [h, g]
        return ModelOutput(last_hidden_state=self.dropout(h if g is None else g),
                           hidden_states=tuple(states) if output_hidden_states else None,
                           attentions=tuple(probs) if output_attentions else None,
                           mems=tuple(new_mems) if use_mems else None)


class PermutationLMHead(nn.Module):
    """XLNet's LM head (``lm_loss``): a biased projection to the vocabulary, tied to the token
    table; labels are the predicted tokens (-100 ignored), not shifted."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder(hidden)

    loss = staticmethod(token_cross_entropy)


class XLNetModel(HeadedModel):
    """``transformer`` (:class:`XLNetTransformer`) + ``heads`` (``plm`` and the task heads, on
    the last state); no pooler (the classification heads summarise the last token)."""

    def __init__(self, config: TransformerConfig, heads: Sequence[str] = (),
                 with_pooler: bool | None = None):
        super().__init__()
        self.config = config
        self.transformer = XLNetTransformer(config)
        self.pooler = None
        self.heads = nn.ModuleDict({name: build_head(name, config) for name in heads})
        self.apply(self._init_weights)
        self.tie_weights()

    def _init_weights(self, module: nn.Module) -> None:
        init_normal(module, self.config.initializer_range)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.transformer.word_embeddings

    def layer_groups(self) -> list[list[nn.Module]]:
        """Modules from the top, for layer-wise learning rates: heads, each layer, embeddings."""
        return [list(self.heads.values()), *([layer] for layer in reversed(
            list(self.transformer.layers))), [self.transformer.word_embeddings]]

    def forward(self, input_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None,
                perm_mask: torch.Tensor | None = None,
                target_mapping: torch.Tensor | None = None,
                mems: Sequence[torch.Tensor] | None = None, use_mems: bool | None = None,
                labels: torch.Tensor | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False,
                heads: Sequence[str] | None = None, p_mask: torch.Tensor | None = None,
                cls_index: torch.Tensor | None = None, **ignored: Any) -> ModelOutput:
        """Run the stack and the heads (all, or those named in ``heads``). ``use_mems``: None =
        the config's ``use_mems_train``/``use_mems_eval`` (transformers' defaults: off, on);
        ``p_mask``, ``cls_index``: the beam QA head's (BeamQuestionAnsweringHead); ``ignored``:
        settings of other stacks (a KV cache, ``skip_padding``)."""
        if use_mems is None:
            key = "use_mems_train" if self.training else "use_mems_eval"
            use_mems = bool(self.config.extra.get(key, not self.training))
        out = self.transformer(input_ids, attention_mask, token_type_ids, inputs_embeds,
                               perm_mask, target_mapping, mems, use_mems,
                               output_hidden_states, output_attentions)
        hidden = out.last_hidden_state
        mask = attention_mask if target_mapping is None else None  # rows are predictions
        head_logits, logits, loss = self.run_heads(heads, hidden, None, mask, labels,
                                                   inputs={"p_mask": p_mask, "cls_index": cls_index})
        return ModelOutput(last_hidden_state=hidden, logits=logits, loss=loss,
                           hidden_states=out.hidden_states, attentions=out.attentions,
                           mems=out.mems, head_logits=head_logits)
