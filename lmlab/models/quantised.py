"""Block-quantised linear maps and embeddings that compute from their low-bit codes, never
holding fp32 weights: 4-bit codes with a scale and a minimum per block of 32 inputs
(``w = d * q + m``, q in 0..15) or 8-bit codes with a scale (``w = d * q``, q in -128..127).
Which file formats fill them is the loaders' business (:mod:`lmlab.interop.gguf`).

The codes are stored interleaved by groups of ``ROWS`` output rows, ``(row groups, blocks,
codes, ROWS)``, so the compiled kernel (:mod:`lmlab.models.block_kernels`) turns each byte into
``ROWS`` vector lanes, dequantises them once and multiplies them with all the batch's rows;
activations stay float32.
"""

from __future__ import annotations

import copy
import functools
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

BLOCK = 32  # weights per block along the input dimension
ROWS = 16  # output rows interleaved per group (one AVX-512 vector of float32 lanes)
PARALLEL_WORK = 2 ** 23  # multiply-adds from which a product runs on every thread


@functools.cache
def load_kernels():
    """numba and the compiled kernels (:mod:`lmlab.models.block_kernels`, cached on disk),
    imported at the first product rather than with this module."""
    import numba

    if "NUMBA_THREADING_LAYER" not in os.environ:  # OpenMP's spinning workers fight torch's
        numba.config.THREADING_LAYER = "workqueue"
    from lmlab.models import block_kernels

    assert (block_kernels.BLOCK, block_kernels.ROWS) == (BLOCK, ROWS)
    kernels = {(bits, parallel): kernel for bits in (4, 8) for parallel, kernel in
               ((False, block_kernels.serial), (True, block_kernels.threaded))}
    scales = np.zeros((1, 1, ROWS), np.uint16)  # GGUF's float16 (float32 compiles later)
    for bits in (4, 8):  # read from numba's cache (or compiled) now
        codes = np.zeros((1, 1, BLOCK // 2 if bits == 4 else BLOCK, ROWS),
                         np.uint8 if bits == 4 else np.int8)
        for parallel in (False, True):
            kernels[bits, parallel](np.zeros((1, BLOCK), np.float32), codes, scales, scales,
                                    np.zeros((1, ROWS), np.float32))
    return numba, kernels


def _interleave(values: np.ndarray) -> np.ndarray:
    """(N, ...) per-row arrays -> (N / ROWS, ..., ROWS), rows padded with zeros to a multiple
    of ROWS, contiguous."""
    pad = -len(values) % ROWS
    if pad:
        values = np.concatenate([values, np.zeros((pad, *values.shape[1:]), values.dtype)])
    grouped = values.reshape(-1, ROWS, *values.shape[1:])  # (N / ROWS, ROWS, ...)
    return np.ascontiguousarray(np.moveaxis(grouped, 1, -1))


class BlockQuantLinear(nn.Module):
    """A bias-optional linear map whose weight is held as block codes (4-bit with scales and
    minima, or 8-bit with scales). Under autograd (``torch.is_grad_enabled()`` and an input
    that needs a gradient) it multiplies by the dequantised weight, so adapters can train on
    top; the codes themselves never train."""

    def __init__(self, codes: np.ndarray, scales: np.ndarray, mins: np.ndarray | None = None,
                 bias: nn.Parameter | None = None):
        """``codes``: (N, K/32, 16) uint8 (low nibble: weight j of a block, high: weight j+16)
        for 4 bits, or (N, K/32, 32) int8; ``scales``, ``mins``: (N, K/32), kept as float16
        where that is exact."""
        super().__init__()
        self.bits = 8 if codes.dtype == np.int8 else 4
        self.out_features, blocks = codes.shape[:2]
        self.in_features = blocks * BLOCK
        self.codes = _interleave(codes)  # (N / ROWS, K / 32, codes per block, ROWS)
        if self.bits == 4 and mins is None:
            mins = np.zeros_like(scales)
        # float16 (GGUF's own) where that holds every scale and minimum exactly
        kept = [a for a in (scales, mins) if a is not None]
        dtype = np.float16 if all(np.array_equal(a.astype(np.float16).astype(np.float32), a)
                                  for a in kept) else np.float32
        self.scales = _interleave(scales.astype(dtype))  # (N / ROWS, K / 32, ROWS)
        self.mins = None if mins is None else _interleave(mins.astype(dtype))
        self.bias = bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, " \
               f"bits={self.bits}, block={BLOCK}"

    @property
    def nbytes(self) -> int:
        """Bytes of the codes, scales and minima."""
        return sum(a.nbytes for a in (self.codes, self.scales, self.mins) if a is not None)

    def rows(self, index: np.ndarray) -> np.ndarray:
        """Dequantised float32 rows ``index`` (n,) -> (n, K): what an embedding lookup needs."""
        group, lane = index // ROWS, index % ROWS
        codes = self.codes[group, :, :, lane]  # (n, K/32, codes per block)
        scales = self.scales[group, :, lane][..., None].astype(np.float32)  # (n, K/32, 1)
        if self.bits == 4:
            codes = np.concatenate([codes & 15, codes >> 4], axis=-1)  # (n, K/32, 32)
        values = codes.astype(np.float32) * scales
        if self.mins is not None:
            values += self.mins[group, :, lane][..., None].astype(np.float32)
        return values.reshape(len(index), self.in_features)

    def dequantize(self) -> torch.Tensor:
        """The (out, in) float32 weight these codes stand for (the reference path)."""
        return torch.from_numpy(self.rows(np.arange(self.out_features)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            return F.linear(x, self.dequantize().to(x.dtype), self.bias)
        numba, kernels = load_kernels()
        flat = x.detach().reshape(-1, self.in_features)  # (tokens, K)
        inputs = np.ascontiguousarray(flat.float().numpy())
        out = np.empty((len(inputs), self.codes.shape[0] * ROWS), np.float32)
        threads = min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)
        parallel = threads > 1 and inputs.size * self.out_features >= PARALLEL_WORK
        if parallel:
            numba.set_num_threads(threads)
        kernel = kernels[self.bits, parallel]
        scales, mins = (a if a.dtype == np.float32 else a.view(np.uint16)  # numba: no float16
                        for a in (self.scales, self.scales if self.mins is None else self.mins))
        kernel(inputs, self.codes, scales, mins, out)
        y = torch.from_numpy(out[:, :self.out_features]).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        """Saved as the float32 ``weight`` it stands for, so a saved model loads as a plain one."""
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "weight"] = self.dequantize()


class BlockQuantEmbedding(nn.Module):
    """A token table read from a :class:`BlockQuantLinear`'s rows (shared with a tied output
    projection): each lookup dequantises only the rows it gathers."""

    def __init__(self, table: BlockQuantLinear, padding_idx: int | None = None):
        super().__init__()
        object.__setattr__(self, "table", table)  # not a submodule: saved once, as ``weight``
        self.num_embeddings, self.embedding_dim = table.out_features, table.in_features
        self.padding_idx = padding_idx

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.table.rows(ids.reshape(-1).cpu().numpy())  # (tokens, dim)
        return torch.from_numpy(rows).reshape(*ids.shape, self.embedding_dim).to(ids.device)

    @property
    def weight(self) -> torch.Tensor:
        """The dequantised (vocabulary, dim) table (for code that reads an embedding's weight)."""
        return self.table.dequantize()

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        destination[prefix + "weight"] = self.weight


def dequantized(model: nn.Module) -> nn.Module:
    """``model`` itself when it holds no block-quantised layer, else a copy whose quantised
    layers are float32 ``nn.Linear``/``nn.Embedding`` (a tied table stays one tensor): what a
    saver or exporter writes."""
    if not any(isinstance(m, (BlockQuantLinear, BlockQuantEmbedding)) for m in model.modules()):
        return model
    model = copy.deepcopy(model)
    weights: dict[int, nn.Parameter] = {}

    def weight(linear: BlockQuantLinear) -> nn.Parameter:
        return weights.setdefault(id(linear), nn.Parameter(linear.dequantize()))

    for name, module in list(model.named_modules()):
        if isinstance(module, BlockQuantLinear):
            new = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None)
            new.weight = weight(module)
            if module.bias is not None:
                new.bias = nn.Parameter(module.bias.detach().clone())
        elif isinstance(module, BlockQuantEmbedding):
            new = nn.Embedding(module.num_embeddings, module.embedding_dim, module.padding_idx)
            new.weight = weight(module.table)
        else:
            continue
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, new)
    return model
