"""Attention masks, boolean (True: may attend) and broadcastable to (B, nh, Tq, Tk); ``None``
lets SDPA see everything (or use its own ``is_causal``); T5's float mask is added to the scores.
"""

from __future__ import annotations

import torch


def causal_mask(q_len: int, k_len: int, device: torch.device | None = None) -> torch.Tensor:
    """(Tq, Tk) lower-triangular mask; with a cache (Tk > Tq) query i sits at position
    ``k_len - q_len + i`` and sees every key up to it."""
    offset = k_len - q_len
    q_pos = torch.arange(q_len, device=device).unsqueeze(1) + offset  # (Tq, 1)
    k_pos = torch.arange(k_len, device=device).unsqueeze(0)  # (1, Tk)
    return k_pos <= q_pos


def prefix_lm_mask(prefix_lengths: torch.Tensor, seq_len: int) -> torch.Tensor:
    """(B, T, T) mask of a prefix LM: bidirectional inside each row's prefix, causal after it."""
    device = prefix_lengths.device
    causal = causal_mask(seq_len, seq_len, device)  # (T, T)
    k_pos = torch.arange(seq_len, device=device)
    in_prefix = k_pos.unsqueeze(0) < prefix_lengths.unsqueeze(1)  # (B, T): key inside prefix
    q_in_prefix = in_prefix.unsqueeze(2)  # (B, T, 1)
    return causal.unsqueeze(0) | (q_in_prefix & in_prefix.unsqueeze(1))


def document_mask(document_ids: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """(B, T, T) mask that stops attention across the documents ``document_ids`` (B, T)
    numbers inside each packed row."""
    same = document_ids.unsqueeze(2) == document_ids.unsqueeze(1)  # (B, T, T)
    if causal:
        same = same & causal_mask(document_ids.shape[1], document_ids.shape[1],
                                  document_ids.device).unsqueeze(0)
    return same


def build_attention_mask(
    attention_mask: torch.Tensor | None,
    q_len: int,
    k_len: int,
    causal: bool,
    device: torch.device,
) -> tuple[torch.Tensor | None, bool]:
    """The user's mask as attention takes it: ``(mask or None, use_is_causal)``.

    ``attention_mask``: None or (B, Tk) padding (joined with causality), or an explicit
    (B, [1,] Tq, Tk) mask used as given. Rows with no visible key are opened up (never read; a
    fully masked softmax would give NaN).
    """
    if attention_mask is not None and attention_mask.dim() >= 3:
        mask = attention_mask.bool()
        if mask.dim() == 3:
            mask = mask.unsqueeze(1)  # (B, 1, Tq, Tk)
        return open_empty_rows(mask), False

    has_padding = attention_mask is not None and not bool(attention_mask.all())
    if not has_padding:
        if not causal:
            return None, False
        if q_len == k_len:
            return None, True
        return causal_mask(q_len, k_len, device)[None, None], False

    keys = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, Tk)
    if causal:
        mask = keys & causal_mask(q_len, k_len, device)[None, None]  # (B, 1, Tq, Tk)
        return open_empty_rows(mask), False
    return keys, False


def open_empty_rows(mask: torch.Tensor) -> torch.Tensor:
    """``mask`` with its rows that see no key opened up (never read; softmax would give NaN)."""
    # No branch on the data (``if empty.any()``): torch.export / ONNX export cannot trace one.
    empty = ~mask.any(dim=-1, keepdim=True)  # (B, 1, Tq, 1)
    return mask | empty


def additive_mask(bias: torch.Tensor, mask: torch.Tensor | None, is_causal: bool,
                  dtype: torch.dtype) -> torch.Tensor:
    """T5's position ``bias`` (1, nh, Tq, Tk) joined with what ``mask``/``is_causal`` hide (the
    most negative value): a float mask (B or 1, nh, Tq, Tk) in ``dtype``."""
    bias = bias.to(dtype)
    q_len, k_len = bias.shape[-2:]
    if is_causal:
        mask = causal_mask(q_len, k_len, bias.device)[None, None]
    if mask is None:
        return bias
    return bias.masked_fill(~mask, torch.finfo(dtype).min)
