"""What a model takes: the tensors of a tokenizer batch, and the longest input it accepts."""

from __future__ import annotations

import torch

from lmlab.utils.errors import LmlabError


def model_inputs(model, batch) -> dict[str, torch.Tensor]:
    """The tensors of a tokenizer batch that the model takes, on the model's device (offsets,
    special-token masks and overflow mappings stay behind)."""
    device = next(model.parameters()).device
    return {k: v.to(device) for k, v in batch.items()
            if k in ("input_ids", "attention_mask", "token_type_ids")}


def max_input_length(model, tokenizer) -> int | None:
    """The longest input the model takes: the tokenizer's limit and the position table's
    (None: no limit, T5's relative positions with an unlimited tokenizer)."""
    limits = [tokenizer.model_max_length] if tokenizer.model_max_length else []
    if model.config.position_embedding != "relative":  # T5's relative positions: no limit
        limits.append(model.config.max_position_embeddings - model.config.position_offset)
    return min(limits) if limits else None


def input_limit(model, tokenizer, max_length: int | None = None) -> int | None:
    """``max_length`` if the model can take it (refused with a message if not), else the
    model's own limit (:func:`max_input_length`)."""
    limit = max_input_length(model, tokenizer)
    if max_length is None:
        return limit
    if max_length < 2:
        raise LmlabError(f"max_length {max_length} leaves no room for a token",
                         "use at least 2 (the special tokens take some)")
    if limit is not None and max_length > limit:
        raise LmlabError(f"max_length {max_length} is more than this model takes ({limit} "
                         "tokens)", f"use {limit} or less (--max-length {limit})")
    return max_length
