"""Input embeddings: tokens + segments + positions, normalised, optionally factorised (E -> H)."""

from __future__ import annotations

import math

import torch
from torch import nn

from lmlab.models.config import TransformerConfig
from lmlab.models.core.norms import make_norm
from lmlab.models.core.positions import sinusoidal_table


class Embeddings(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        width = config.input_embedding_size
        # T5's table has no padding row: its decoder starts from the pad token, which must learn
        padding_idx = None if config.extra.get("pad_row_trains") else config.pad_token_id
        self.word_embeddings = nn.Embedding(config.vocab_size, width, padding_idx=padding_idx)
        self.position_embeddings = None
        if config.position_embedding == "learned":
            self.position_embeddings = nn.Embedding(config.max_position_embeddings, width)
        elif config.position_embedding == "sinusoidal":
            layout = config.extra.get("sinusoid_layout", "interleaved")
            self.register_buffer("sinusoids",
                                 sinusoidal_table(config.max_position_embeddings, width, layout),
                                 persistent=False)
        self.scale = math.sqrt(width) if config.scale_embedding else 1.0
        self.token_type_embeddings = (nn.Embedding(config.type_vocab_size, width)
                                      if config.type_vocab_size > 0 else None)
        self.norm = make_norm(config.norm_type, width, config.norm_eps) if config.embedding_norm else None
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.projection = nn.Linear(width, config.hidden_size) if width != config.hidden_size else None

    def default_position_ids(self, input_ids: torch.Tensor | None, batch: int, length: int,
                             past_length: int, device: torch.device) -> torch.Tensor:
        """Position ids when the caller gives none.

        Positions count from ``past_length``; with ``position_offset > 0`` (RoBERTa) real
        tokens are numbered from the offset and padding gets ``offset - 1``, as fairseq did.
        """
        offset = self.config.position_offset
        if offset > 0 and input_ids is not None and self.config.pad_token_id is not None:
            real = (input_ids != self.config.pad_token_id).long()
            return (torch.cumsum(real, dim=1) + past_length) * real + (offset - 1)
        positions = torch.arange(past_length, past_length + length, device=device)
        return positions.unsqueeze(0).expand(batch, length)

    def forward(self, input_ids: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None,
                past_length: int = 0) -> torch.Tensor:
        """Embed; returns (B, T, H)."""
        if inputs_embeds is None:
            x = self.word_embeddings(input_ids)
            if self.scale != 1.0:  # the lookup is scaled, given embeddings are not (as in HF)
                x = x * self.scale
        else:
            x = inputs_embeds
        batch, length = x.shape[:2]
        if self.position_embeddings is not None or self.config.position_embedding == "sinusoidal":
            if position_ids is None:
                position_ids = self.default_position_ids(input_ids, batch, length, past_length,
                                                         x.device)
            if self.position_embeddings is not None:
                x = x + self.position_embeddings(position_ids)
            else:
                x = x + self.sinusoids[position_ids].to(x.dtype)
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros(batch, length, dtype=torch.long, device=x.device)
            x = x + self.token_type_embeddings(token_type_ids)
        if self.norm is not None:
            x = self.norm(x)
        x = self.dropout(x)
        if self.projection is not None:
            x = self.projection(x)
        return x
