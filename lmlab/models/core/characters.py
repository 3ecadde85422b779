"""CANINE's character pieces (Clark et al. 2022): hashed codepoint embeddings, attention in
blocks of characters, the strided convolution from characters to molecules and the convolution
back (docs/characters.md). The stacks between them are core layers (lmlab/models/canine.py).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from lmlab.models.config import TransformerConfig
from lmlab.models.core.activations import activation
from lmlab.models.core.layer import TransformerLayer
from lmlab.utils.errors import LmlabError

#: one prime per hash function (CANINE's, which allows up to 16 functions)
PRIMES = (31, 43, 59, 61, 73, 97, 103, 113, 137, 149, 157, 173, 181, 193, 211, 223)


def canine_settings(config: TransformerConfig) -> dict[str, int]:
    """CANINE's settings (``config.extra``, with CanineConfig's defaults), checked."""
    values = {"downsampling_rate": 4, "upsampling_kernel_size": 4, "num_hash_functions": 8,
              "num_hash_buckets": 16384, "local_transformer_stride": 128}
    values.update({k: int(config.extra[k]) for k in values if config.extra.get(k) is not None})
    hashes = values["num_hash_functions"]
    if not 1 <= hashes <= len(PRIMES) or config.hidden_size % hashes:
        raise LmlabError(f"num_hash_functions {hashes} with hidden_size {config.hidden_size}",
                         f"use 1 to {len(PRIMES)} hash functions that divide the hidden size")
    if min(values.values()) < 1:
        raise LmlabError(f"CANINE settings must be positive, got {values}",
                         "set each of them to 1 or more")
    return values


class HashEmbeddings(nn.Module):
    """Codepoints embedded by ``num_hash_functions`` hashes ``(id + 1) * prime % buckets``,
    one table of hidden / hashes columns each, concatenated; plus positions and token types,
    then LayerNorm and dropout (no vocabulary: any codepoint has an embedding)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        settings = canine_settings(config)
        self.buckets = settings["num_hash_buckets"]
        self.primes = PRIMES[:settings["num_hash_functions"]]
        width = config.hidden_size // len(self.primes)
        self.hash_tables = nn.ModuleList(nn.Embedding(self.buckets, width) for _ in self.primes)
        self.position_embeddings = nn.Embedding(self.buckets, config.hidden_size)
        self.max_length = min(self.buckets, config.max_position_embeddings)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def codepoint_vectors(self, ids: torch.Tensor) -> torch.Tensor:
        """(...) codepoints -> (..., H): the hash shards concatenated, no position or type."""
        return torch.cat([table((ids + 1) * prime % self.buckets)
                          for table, prime in zip(self.hash_tables, self.primes)], dim=-1)

    def forward(self, input_ids: torch.Tensor | None, token_type_ids: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) codepoints (or (B, T, H) ``inputs_embeds``) -> (B, T, H)."""
        x = self.codepoint_vectors(input_ids) if inputs_embeds is None else inputs_embeds
        batch, length = x.shape[:2]
        if position_ids is None:
            if length > self.max_length:
                raise LmlabError(f"{length} characters are more than the {self.max_length} "
                                 "positions this CANINE has", f"cut texts to {self.max_length} "
                                 "characters (truncation=True, max_length=...)")
            position_ids = torch.arange(length, device=x.device).expand(batch, length)
        if token_type_ids is None:
            token_type_ids = torch.zeros(batch, length, dtype=torch.long, device=x.device)
        x = x + self.token_type_embeddings(token_type_ids) + self.position_embeddings(position_ids)
        return self.dropout(self.norm(x))


def local_layer(layer: TransformerLayer, x: torch.Tensor, attention_mask: torch.Tensor,
                block: int, output_attentions: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run ``layer`` with attention inside blocks of ``block`` characters (CANINE's initial
    character encoder): each block a row of its own. Padding keys get the most negative score
    as in CANINE (a block of padding attends evenly to itself); the positions added to fill the
    last block get -inf, so no real block sees them. Probabilities: the first block's."""
    batch, length, hidden = x.shape
    blocks = -(-length // block)
    extra = blocks * block - length
    keys = F.pad(attention_mask.to(torch.long), (0, extra), value=-1)  # (B, nb * S); -1: filler
    lowest = torch.finfo(x.dtype).min
    bias = torch.where(keys == 1, 0.0, torch.where(keys == 0, lowest, float("-inf"))).to(x.dtype)
    rows = F.pad(x, (0, 0, 0, extra)).reshape(batch * blocks, block, hidden)  # (B * nb, S, H)
    out, probs, _ = layer(rows, mask=bias.view(batch * blocks, 1, 1, block),
                          output_attentions=output_attentions)
    out = out.reshape(batch, blocks * block, hidden)[:, :length]
    if probs is not None:
        width = min(block, length)  # the first block, as transformers reports it
        probs = probs.view(batch, blocks, *probs.shape[1:])[:, 0, :, :width, :width]
    return out, probs


class CharactersToMolecules(nn.Module):
    """Downsampling: a convolution of kernel and stride ``downsampling_rate`` over the
    characters, activation, the last molecule dropped for [CLS] kept in front, LayerNorm."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        rate = canine_settings(config)["downsampling_rate"]
        self.conv = nn.Conv1d(config.hidden_size, config.hidden_size, rate, stride=rate)
        self.act = activation(config.hidden_act)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps)

    def forward(self, chars: torch.Tensor) -> torch.Tensor:
        """(B, T, H) characters -> (B, T // rate, H) molecules, [CLS] first."""
        molecules = self.act(self.conv(chars.transpose(1, 2)).transpose(1, 2))  # (B, T//r, H)
        return self.norm(torch.cat([chars[:, :1], molecules[:, :-1]], dim=1))


def repeat_molecules(molecules: torch.Tensor, length: int, rate: int) -> torch.Tensor:
    """Upsampling's first step: each molecule after [CLS] repeated ``rate`` times, the last
    also over the remaining characters: (B, M, H) -> (B, length, H)."""
    repeated = molecules[:, 1:].repeat_interleave(rate, dim=1)  # (B, (M - 1) * rate, H)
    tail = molecules[:, -1:].repeat_interleave(length % rate + rate, dim=1)
    return torch.cat([repeated, tail], dim=1)


class ConvProjection(nn.Module):
    """Upsampling's projection: [initial characters; repeated molecules] (B, T, 2H) through a
    convolution of ``upsampling_kernel_size`` with SAME padding (the extra zero at the end),
    activation, LayerNorm, dropout -> (B, T, H)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        kernel = canine_settings(config)["upsampling_kernel_size"]
        self.padding = ((kernel - 1) // 2, kernel - 1 - (kernel - 1) // 2)
        self.conv = nn.Conv1d(2 * config.hidden_size, config.hidden_size, kernel)
        self.act = activation(config.hidden_act)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(F.pad(x.transpose(1, 2), self.padding)).transpose(1, 2)  # (B, T, H)
        return self.dropout(self.norm(self.act(x)))
