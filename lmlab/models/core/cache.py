"""Key/value cache for incremental decoding."""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values of every layer seen so far, each (B, n_kv_heads, T, head_dim); a
    decoder keeps the encoder side's (computed once) in ``cross``."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor | None] = []
        self.values: list[torch.Tensor | None] = []
        self.cross: KVCache | None = None  # a decoder's cross-attention keys (encoder side)

    def seq_len(self, layer: int = 0) -> int:
        """Number of cached positions (0 before the first step)."""
        if layer >= len(self.keys) or self.keys[layer] is None:
            return 0
        return self.keys[layer].shape[2]

    def update(self, layer: int, keys: torch.Tensor, values: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        while len(self.keys) <= layer:
            self.keys.append(None)
            self.values.append(None)
        if self.keys[layer] is None:
            self.keys[layer], self.values[layer] = keys, values
        else:
            self.keys[layer] = torch.cat([self.keys[layer], keys], dim=2)
            self.values[layer] = torch.cat([self.values[layer], values], dim=2)
        return self.keys[layer], self.values[layer]

    def reorder(self, index: torch.Tensor) -> None:
        """Keep batch rows ``index`` (beam search)."""
        self.keys = [k.index_select(0, index) if k is not None else None for k in self.keys]
        self.values = [v.index_select(0, index) if v is not None else None for v in self.values]
        if self.cross is not None:
            self.cross.reorder(index)
