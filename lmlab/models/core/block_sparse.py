"""BigBird's block-sparse attention (Zaheer et al. 2020, the ITC pattern): the sequence goes in
blocks of ``block_size``; the first and last blocks are global (they see, and are seen by, every
block); every other block sees its window of 3 blocks, the global blocks and
``num_random_blocks`` random blocks. Key blocks are gathered per query block, so memory grows
linearly with the length: the (T, T) scores are never built (docs/long-attention.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.nn import functional as F

from lmlab.utils.errors import LmlabError

if TYPE_CHECKING:
    from lmlab.models.config import TransformerConfig

#: the first block, the window (previous, own, next block), the last block
_FIXED = 5


def check_block_sparse(config: TransformerConfig) -> dict[str, int]:
    """``config.block_sparse``, ``{"block_size": b, "num_random_blocks": r}``, checked (b >= 1,
    r >= 0 whole numbers; a bidirectional stack of absolute positions, no attention window)."""
    settings = config.block_sparse
    if not isinstance(settings, dict) or set(settings) != {"block_size", "num_random_blocks"}:
        raise LmlabError(f"block_sparse {settings!r} is not a block_size and num_random_blocks",
                         'give block_sparse={"block_size": 64, "num_random_blocks": 3}')
    for key, least in (("block_size", 1), ("num_random_blocks", 0)):
        value = settings[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise LmlabError(f"block_sparse {key} {value!r} is not a whole number >= {least}",
                             f"give {key} a whole number of at least {least}")
    if (config.causal or config.is_encoder_decoder or config.attention_window
            or config.relative_attention or config.position_embedding == "relative"):
        raise LmlabError("block-sparse attention in a decoder, an encoder-decoder, with an "
                         "attention window or relative position biases is not supported",
                         "use block_sparse in an encoder of absolute or rotary positions")
    return dict(settings)


def sparse_applies(length: int, block_size: int, num_random_blocks: int) -> bool:
    """Whether ``length`` tokens take the sparse pattern: transformers' rule, more than the
    global, window and twice the random blocks' tokens; shorter inputs attend densely."""
    return length > (_FIXED + 2 * num_random_blocks) * block_size


def random_blocks(blocks: int, heads: int, count: int, seed: int | None,
                  device: torch.device | None = None) -> torch.Tensor:
    """Each head's random key blocks (nh, blocks - 2, count) for the query blocks 1 .. blocks-2.
    ``seed`` None: transformers' eval pattern, every random block is block 0. Else ``count``
    distinct blocks drawn uniformly by a torch generator seeded with ``seed`` among the blocks
    outside the global blocks and the row's window (row 1 not the second last block, the
    second last row not block 1, as in transformers)."""
    if seed is None:
        return torch.zeros(heads, blocks - 2, count, dtype=torch.long, device=device)
    rows = torch.arange(1, blocks - 1).unsqueeze(1)  # (n - 2, 1)
    keys = torch.arange(blocks)
    legal = (keys > 0) & (keys < blocks - 1) & ((keys - rows).abs() > 1)  # (n - 2, n)
    legal[0, blocks - 2] = legal[-1, 1] = False
    draws = torch.rand(heads, blocks - 2, blocks, generator=torch.Generator().manual_seed(seed))
    return draws.masked_fill(~legal, -1.0).topk(count, dim=-1).indices.to(device)


def block_sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           keys: torch.Tensor | None, block_size: int, num_random_blocks: int,
                           scale: float, dropout_p: float = 0.0, seed: int | None = None,
                           probabilities: bool = False
                           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """BigBird attention of q, k, v (B, nh, T, hd), ``keys`` (B, T) the real tokens (None: all):
    the context (B, nh, T, hd) and, with ``probabilities``, the (B, nh, T, T) weights (a key
    block seen twice, as block 0 is in eval, counts twice). T is padded to whole blocks here
    (transformers pads the input ids; the padding is masked either way). ``seed``:
    :func:`random_blocks`'s."""
    batch, heads, length, dim = q.shape
    size = block_size
    blocks = -(-length // size)
    pad = blocks * size - length
    real = keys.bool() if keys is not None else q.new_ones(batch, length, dtype=torch.bool)
    real = F.pad(real, (0, pad), value=False)  # (B, n * b)
    q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    upcast = torch.promote_types(q.dtype, torch.float32)
    hidden = torch.finfo(q.dtype).min

    # the global rows (blocks 0 and n-1) see every real key
    ends = torch.cat([q[:, :, :size], q[:, :, -size:]], dim=2)  # (B, nh, 2b, hd)
    scores = torch.matmul(ends, k.transpose(-1, -2)) * scale  # (B, nh, 2b, n * b)
    scores = scores.masked_fill(~real[:, None, None, :], hidden)
    end_probs = F.dropout(torch.softmax(scores, dim=-1, dtype=upcast).to(q.dtype), dropout_p)
    end_context = torch.matmul(end_probs, v)  # (B, nh, 2b, hd)

    # rows 1 .. n-2: key blocks [0, i-1, i, i+1, n-1] and the random ones; in rows 1 and n-2
    # the window reaches a global block, whose column is then left out (not seen twice)
    rows = torch.arange(1, blocks - 1, device=q.device)
    fixed = torch.stack([torch.zeros_like(rows), rows - 1, rows, rows + 1,
                         torch.full_like(rows, blocks - 1)], dim=1)  # (n - 2, 5)
    chosen = random_blocks(blocks, heads, num_random_blocks, seed, q.device)
    index = torch.cat([fixed.expand(heads, -1, -1), chosen], dim=2)  # (nh, n - 2, s)
    span = index.shape[-1]
    head = torch.arange(heads, device=q.device)[:, None, None]
    key_blocks = k.reshape(batch, heads, blocks, size, dim)[:, head, index]  # (B, nh, n-2, s, b, hd)
    value_blocks = v.reshape(batch, heads, blocks, size, dim)[:, head, index]
    middle = q.reshape(batch, heads, blocks, size, dim)[:, :, 1:-1]  # (B, nh, n - 2, b, hd)
    scores = torch.matmul(middle, key_blocks.flatten(3, 4).transpose(-1, -2)) * scale
    seen = real.view(batch, blocks, size)[:, index]  # (B, nh, n - 2, s, b)
    once = torch.ones(blocks - 2, span, dtype=torch.bool, device=q.device)
    once[0, 0] = once[-1, _FIXED - 1] = False  # (n - 2, s)
    seen = (seen & once[None, None, :, :, None]).flatten(3, 4)  # (B, nh, n - 2, s * b)
    scores = scores.masked_fill(~seen[:, :, :, None, :], hidden)  # (B, nh, n - 2, b, s * b)
    probs = F.dropout(torch.softmax(scores, dim=-1, dtype=upcast).to(q.dtype), dropout_p)
    context = torch.matmul(probs, value_blocks.flatten(3, 4))  # (B, nh, n - 2, b, hd)

    context = torch.cat([end_context[:, :, :size], context.flatten(2, 3),
                         end_context[:, :, size:]], dim=2)[:, :, :length]  # (B, nh, T, hd)
    if not probabilities:
        return context, None
    weights = q.new_zeros(batch, heads, blocks - 2, size, blocks, size)
    spread = index[None, :, :, None, :, None].expand(batch, -1, -1, size, -1, size)
    weights.scatter_add_(4, spread, probs.view(batch, heads, blocks - 2, size, span, size))
    weights = torch.cat([end_probs[:, :, :size], weights.flatten(4, 5).flatten(2, 3),
                         end_probs[:, :, size:]], dim=2)  # (B, nh, n * b, n * b)
    return context, weights[:, :, :length, :length]
