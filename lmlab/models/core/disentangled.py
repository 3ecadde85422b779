"""DeBERTa's disentangled attention (He et al. 2021): beside the content-to-content scores,
content-to-position ("c2p": each query against the embedding of its distance to each key) and
position-to-content ("p2c": each key against the embedding of its distance to each query) terms
from one relative-distance table shared by all layers; v2 log-buckets the distances
(``position_buckets``), may normalise the table (``norm_rel_ebd``) and project it with the
content query/key maps (``share_att_key``). Every term is scaled by ``1/sqrt(d * (1 + terms))``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from lmlab.models.config import TransformerConfig


def log_bucket(relative: torch.Tensor, buckets: int, max_position: int) -> torch.Tensor:
    """DeBERTa-v2's buckets: distances under ``buckets // 2`` exact, longer ones on a log scale
    up to ``max_position`` (the sign kept)."""
    sign = torch.sign(relative)
    mid = buckets // 2
    near = (relative < mid) & (relative > -mid)
    distance = torch.where(near, torch.tensor(mid - 1).type_as(relative), relative.abs())
    log_pos = torch.ceil(torch.log(distance / mid) / torch.log(torch.tensor((max_position - 1) / mid))
                         * (mid - 1)) + mid
    return torch.where(distance <= mid, relative.type_as(log_pos), log_pos * sign).long()


class RelativePositions(nn.Module):
    """The stack's relative-distance table (2 * span, H), normalised if configured, and the
    (Tq, Tk) index ``query - key`` (bucketed) that the layers' :class:`DisentangledBias` read."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.span, self.buckets = config.relative_span, config.position_buckets
        self.max_position = config.relative_max_distance
        self.embeddings = nn.Embedding(2 * self.span, config.hidden_size)
        self.norm = (nn.LayerNorm(config.hidden_size, eps=config.norm_eps)
                     if "layer_norm" in config.norm_rel_ebd else None)

    def forward(self, q_len: int, k_len: int, device: torch.device
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """(table (2 * span, H), relative index (Tq, Tk))."""
        table = self.embeddings.weight
        if self.norm is not None:
            table = self.norm(table)
        relative = (torch.arange(q_len, device=device)[:, None]
                    - torch.arange(k_len, device=device)[None, :])  # (Tq, Tk): query - key
        if self.buckets > 0:
            relative = log_bucket(relative, self.buckets, self.max_position)
        return table, relative


class DisentangledBias(nn.Module):
    """One layer's c2p and p2c terms, added to its scores: position keys and queries are the
    table through ``pos_key_proj`` / ``pos_query_proj`` (or the content maps, shared)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.types = tuple(config.pos_att_type or ())
        self.heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.scale = 1.0 / math.sqrt(config.head_dim * (1 + len(self.types)))
        self.shared = config.share_att_key
        width = config.num_attention_heads * config.head_dim
        if not self.shared and "c2p" in self.types:
            self.pos_key_proj = nn.Linear(config.hidden_size, width,
                                          bias=config.extra.get("key_bias", True))
        if not self.shared and "p2c" in self.types:
            self.pos_query_proj = nn.Linear(config.hidden_size, width)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], self.heads, self.head_dim).transpose(0, 1)  # (nh, 2S, hd)

    def forward(self, q: torch.Tensor, k: torch.Tensor, table: torch.Tensor,
                relative: torch.Tensor, q_proj: nn.Linear, k_proj: nn.Linear) -> torch.Tensor:
        """The bias (B, nh, Tq, Tk) for queries ``q`` and keys ``k`` (B, nh, T, hd)."""
        table = self.dropout(table)
        span = table.shape[0] // 2
        bias = 0
        if "c2p" in self.types:
            pos_k = self._heads((k_proj if self.shared else self.pos_key_proj)(table))
            c2p = torch.matmul(q, pos_k.transpose(-1, -2))  # (B, nh, Tq, 2S)
            index = torch.clamp(relative + span, 0, 2 * span - 1)  # (Tq, Tk)
            bias = bias + torch.gather(c2p, -1, index.expand(*c2p.shape[:2], *index.shape))
        if "p2c" in self.types:
            pos_q = self._heads((q_proj if self.shared else self.pos_query_proj)(table))
            p2c = torch.matmul(k, pos_q.transpose(-1, -2))  # (B, nh, Tk, 2S)
            index = torch.clamp(-relative + span, 0, 2 * span - 1)  # (Tk, Tk): self-attention
            p2c = torch.gather(p2c, -1, index.expand(*p2c.shape[:2], *index.shape))
            bias = bias + p2c.transpose(-1, -2)  # (B, nh, Tq, Tk)
        return bias * self.scale
