"""GGUF files (llama.cpp's format), the container only: typed key/value metadata, the tensor
table, and tensors dequantised to float32. The header is parsed here (the ``gguf`` package's
reader takes seconds on a 49k vocabulary), the data memory-mapped (docs/decoders.md).
"""

from __future__ import annotations

import mmap
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lmlab.utils.errors import LmlabError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# GGUF metadata value types -> struct format (scalars) ; 8 = string, 9 = array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
          6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_STRING, _ARRAY = 8, 9

# ggml tensor types read without block dequantisation.
_PLAIN_TYPES = {0: np.float32, 1: np.float16, 24: np.int8, 25: np.int16, 26: np.int32,
                27: np.int64, 28: np.float64}
_BF16 = 30
_Q4_0, _Q4_1, _Q8_0 = 2, 3, 8  # dequantised by _dequantize_blocks


def _block_sizes(ggml_type: int) -> tuple[int, int] | None:
    """(weights, bytes) of one block of ``ggml_type``; None for a type ``gguf`` does not know."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        return GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        return None


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file: numpy-order shape (ggml's dims reversed), ggml type, and the
    byte offset of its data in the file."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int

    @property
    def nbytes(self) -> int | None:
        """Bytes of the stored data (None for a ggml type the ``gguf`` package does not know)."""
        sizes = _block_sizes(self.ggml_type)
        return None if sizes is None else int(np.prod(self.shape)) // sizes[0] * sizes[1]

    @property
    def type_name(self) -> str:
        from gguf import GGMLQuantizationType

        try:
            return GGMLQuantizationType(self.ggml_type).name
        except ValueError:
            return f"type{self.ggml_type}"


class GGUFFile:
    """Metadata and tensors of a GGUF file (memory-mapped; close it or use ``with``)."""

    def __init__(self, path: str | Path, read_tensors: bool = True):
        self.path = Path(path)
        if not self.path.is_file():
            raise LmlabError(f"{self.path} does not exist", "give the path of a .gguf file")
        self._file = open(self.path, "rb")
        try:
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:
            self._file.close()
            raise LmlabError(f"{self.path} is empty", "give a complete .gguf file") from None
        self.metadata: dict[str, Any] = {}
        self.tensors: dict[str, TensorInfo] = {}
        try:
            self._parse(read_tensors)
        except LmlabError:
            self.close()
            raise
        except (struct.error, UnicodeDecodeError, IndexError) as error:
            self.close()
            raise LmlabError(f"{self.path} is not a readable GGUF file ({error})",
                             "check that the download is complete and the file is GGUF v2/v3"
                             ) from None

    # -- parsing ---------------------------------------------------------------------------------
    def _need(self, end: int, part: str = "") -> None:
        """Refuse a file that ends before byte ``end`` (a cut download) before any work: the
        header and tensor table need at least ``end`` bytes, the tensor data exactly ``end``."""
        if end > len(self._map):
            raise LmlabError(f"{self.path} is truncated: it has {len(self._map):,} bytes but its "
                             f"{part or self._part} needs {'' if part else 'at least '}{end:,}",
                             "the file is incomplete: download it again (or export it again "
                             "with `lmlab export gguf`)")

    def _unpack(self, fmt: str) -> Any:
        size = struct.calcsize("<" + fmt)
        if self._pos + size > len(self._map):  # tested here: ~100k calls for a 49k vocabulary
            self._need(self._pos + size)
        value = struct.unpack_from("<" + fmt, self._map, self._pos)
        self._pos += size
        return value[0]

    def _string(self) -> str:
        length = self._unpack("Q")
        raw = self._map[self._pos:self._pos + length]
        if len(raw) < length:
            self._need(self._pos + length)
        self._pos += length
        return raw.decode("utf-8", errors="replace")

    def _value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self._unpack(_SCALARS[kind])
        if kind == _STRING:
            return self._string()
        if kind == _ARRAY:
            item_kind, count = self._unpack("I"), self._unpack("Q")
            if item_kind in _NUMPY:
                dtype = np.dtype(_NUMPY[item_kind]).newbyteorder("<")
                self._need(self._pos + count * dtype.itemsize)
                values = np.frombuffer(self._map, dtype=dtype, count=count, offset=self._pos)
                self._pos += values.nbytes
                return values.tolist()
            if item_kind == _STRING:  # the vocabulary and merges: 100k strings, read inline
                strings, pos, data = [], self._pos, self._map
                try:
                    for _ in range(count):
                        length = struct.unpack_from("<Q", data, pos)[0]
                        strings.append(data[pos + 8:pos + 8 + length].decode("utf-8", "replace"))
                        pos += 8 + length
                except struct.error:
                    self._need(pos + 8)
                    raise
                self._need(pos)
                self._pos = pos
                return strings
            return [self._value(item_kind) for _ in range(count)]
        raise LmlabError(f"{self.path} has metadata of unknown type {kind}",
                         "the file may come from a newer GGUF version; re-convert it")

    def _parse(self, read_tensors: bool) -> None:
        self._pos = 0
        if self._map[:4] != GGUF_MAGIC:
            raise LmlabError(f"{self.path} is not a GGUF file (bad magic number)",
                             "give a .gguf file written by llama.cpp's converter")
        self._pos, self._part = 4, "header"
        self.version = self._unpack("I")
        if self.version not in (2, 3):
            raise LmlabError(f"{self.path} is GGUF version {self.version}",
                             "lmlab reads GGUF versions 2 and 3")
        tensor_count, kv_count = self._unpack("Q"), self._unpack("Q")
        for _ in range(kv_count):
            key = self._string()
            self.metadata[key] = self._value(self._unpack("I"))
        if not read_tensors:
            return
        infos, self._part = [], "tensor table"
        for _ in range(tensor_count):
            name = self._string()
            dims = [self._unpack("Q") for _ in range(self._unpack("I"))]
            infos.append((name, tuple(reversed(dims)), self._unpack("I"), self._unpack("Q")))
        alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        start = (self._pos + alignment - 1) // alignment * alignment
        self.tensors = {name: TensorInfo(name, shape, kind, start + offset)
                        for name, shape, kind, offset in infos}
        self._need(max((info.offset + info.nbytes for info in self.tensors.values()
                        if info.nbytes is not None), default=0), "tensor data")

    # -- tensors ---------------------------------------------------------------------------------
    def raw(self, name: str) -> tuple[np.ndarray, TensorInfo]:
        """The tensor's bytes as stored (a view into the memory map) and its description."""
        info = self.tensors[name]
        rows = int(np.prod(info.shape[:-1])) if len(info.shape) > 1 else 1
        if info.ggml_type in _PLAIN_TYPES or info.ggml_type == _BF16:
            dtype = np.uint16 if info.ggml_type == _BF16 else _PLAIN_TYPES[info.ggml_type]
            count = int(np.prod(info.shape))
            data = np.frombuffer(self._map, dtype=dtype, count=count, offset=info.offset)
            return data.reshape(info.shape), info
        sizes = _block_sizes(info.ggml_type)
        if sizes is None:
            raise LmlabError(f"tensor {name} has ggml type {info.ggml_type}, which the gguf "
                             "package does not know",
                             "upgrade the gguf package or re-quantise the file")
        block, type_size = sizes
        row_bytes = info.shape[-1] // block * type_size
        data = np.frombuffer(self._map, dtype=np.uint8, count=rows * row_bytes,
                             offset=info.offset)
        return data.reshape(*info.shape[:-1], row_bytes), info

    def tensor(self, name: str) -> np.ndarray:
        """The tensor dequantised to float32 (numpy order: rows = output features)."""
        out = np.empty(self.tensors[name].shape, dtype=np.float32)
        self.tensor_into(name, out)
        return out

    def tensor_into(self, name: str, out: np.ndarray) -> None:
        """Dequantise ``name`` into ``out`` (e.g. a parameter's memory) 256 KB of float32 at a
        time, so a large table needs no scratch memory beyond a chunk."""
        data, info = self.raw(name)
        if out.shape != info.shape:
            raise LmlabError(f"{name} has shape {info.shape}, the model expects {out.shape}",
                             "the file's metadata and tensors disagree; re-convert it")
        if out.dtype != np.float32 or not out.flags.c_contiguous:
            out[...] = self.tensor(name)
        elif info.ggml_type == _BF16:
            out[...] = (data.astype(np.uint32) << 16).view(np.float32)
        elif info.ggml_type in _PLAIN_TYPES:
            out[...] = data
        else:
            from gguf import GGMLQuantizationType
            from gguf.quants import dequantize

            rows = data.reshape(-1, data.shape[-1])  # (rows, bytes per row)
            values = out.reshape(len(rows), -1)  # (rows, weights per row): a view of out
            step = max(1, 2 ** 16 // values.shape[1])
            for start in range(0, len(rows), step):
                blocks, dest = rows[start:start + step], values[start:start + step]
                if info.ggml_type in (_Q4_0, _Q4_1, _Q8_0):
                    # (blocks, bytes per block) -> (blocks, 32 weights)
                    _dequantize_blocks(blocks.reshape(dest.size // 32, -1), info.ggml_type,
                                       dest.reshape(-1, 32))
                    continue
                try:
                    dest[...] = dequantize(blocks, GGMLQuantizationType(info.ggml_type))
                except NotImplementedError:
                    raise LmlabError(f"tensor {name} is {info.type_name}, which gguf cannot "
                                     "dequantise", "re-quantise the file to a common type "
                                     "(Q4_0/Q4_1/Q8_0/F16)") from None

    def type_counts(self) -> dict[str, int]:
        """How many tensors of each ggml type the file holds (e.g. {"Q4_1": 210, ...})."""
        return dict(Counter(info.type_name for info in self.tensors.values()))

    def release(self, name: str) -> None:
        """Drop tensor ``name``'s pages from this process's memory (they stay in the page
        cache and are read again if touched), so a loader's peak holds one tensor of the file."""
        info, page = self.tensors[name], mmap.PAGESIZE
        start = info.offset // page * page
        self._map.madvise(mmap.MADV_DONTNEED, start, (info.nbytes or 0) + info.offset - start)

    def close(self) -> None:
        self._map.close()
        self._file.close()

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _dequantize_blocks(blocks: np.ndarray, ggml_type: int, out: np.ndarray) -> None:
    """Q4_0/Q4_1/Q8_0 ``blocks`` (n, bytes per block) into ``out`` (n, 32) in place, in
    ``gguf.quants``' order of operations (the same bits) without its temporaries. A block is
    an fp16 scale (Q4_1: and minimum), then 32 int8 or 16 bytes of two 4-bit weights."""
    scale = blocks[:, :2].view(np.float16).astype(np.float32)  # (n, 1)
    if ggml_type == _Q8_0:
        out[...] = blocks[:, 2:].view(np.int8)
    else:
        nibbles = blocks[:, 4:] if ggml_type == _Q4_1 else blocks[:, 2:]  # (n, 16)
        out[:, :16] = nibbles & 15  # the low halves are the block's first 16 weights
        out[:, 16:] = nibbles >> 4
        if ggml_type == _Q4_0:
            out -= 8  # exact in float32, as gguf's int8 subtraction
    out *= scale
    if ggml_type == _Q4_1:
        out += blocks[:, 2:4].view(np.float16).astype(np.float32)


def read_metadata(path: str | Path) -> dict[str, Any]:
    """Only the key/value metadata of a GGUF file (the tokenizer needs nothing else)."""
    with GGUFFile(path, read_tensors=False) as file:
        return dict(file.metadata)
