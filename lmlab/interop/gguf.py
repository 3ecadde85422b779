"""GGUF files (llama.cpp's format): metadata, dequantised tensors, and Llama-style models.

A GGUF file is a header of typed key/value metadata (architecture sizes, the tokenizer's
vocabulary and merges, the chat template), a table of tensor descriptions, and the tensor data,
often quantised in blocks (Q4_1: 32 weights share an fp16 scale and minimum; Q8_0: 32 int8 with
one fp16 scale). This module parses the header itself (a few hundred milliseconds for a 49k
vocabulary; the ``gguf`` package's reader takes seconds because it builds Python objects for
every field part), memory-maps the data, and dequantises one tensor at a time with
``gguf.quants.dequantize``, so loading peaks at about one fp32 model plus one tensor.

llama.cpp's converter permutes the rows of the query and key projections so its rotary kernel
can rotate adjacent pairs; :func:`lmlab.models.core.positions.rotary_rows_from_pairs` undoes
that, giving back the
"rotate half" layout of Hugging Face's Llama and of :mod:`lmlab.models.core.positions`.

Example:
    >>> model = load_gguf_model("SmolLM2-135M-Instruct.Q4_1.gguf")   # a LanguageModel, "clm" head
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lmlab.interop.families import KNOWN_FAMILIES, FamilySpec, expand_rules, get_family
from lmlab.models.config import TransformerConfig
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


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file: numpy-order shape (ggml's dims reversed), ggml type, and the
    byte offset of its data in the file."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int

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
        except (struct.error, UnicodeDecodeError, IndexError) as error:
            self.close()
            raise LmlabError(f"{self.path} is not a readable GGUF file ({error})",
                             "check that the download is complete and the file is GGUF v2/v3"
                             ) from None

    # -- parsing ---------------------------------------------------------------------------------
    def _unpack(self, fmt: str) -> Any:
        value = struct.unpack_from("<" + fmt, self._map, self._pos)
        self._pos += struct.calcsize("<" + fmt)
        return value[0]

    def _string(self) -> str:
        length = self._unpack("Q")
        raw = self._map[self._pos:self._pos + length]
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
                values = np.frombuffer(self._map, dtype=dtype, count=count, offset=self._pos)
                self._pos += values.nbytes
                return values.tolist()
            return [self._value(item_kind) for _ in range(count)]
        raise LmlabError(f"{self.path} has metadata of unknown type {kind}",
                         "the file may come from a newer GGUF version; re-convert it")

    def _parse(self, read_tensors: bool) -> None:
        self._pos = 0
        if self._map[:4] != GGUF_MAGIC:
            raise LmlabError(f"{self.path} is not a GGUF file (bad magic number)",
                             "give a .gguf file written by llama.cpp's converter")
        self._pos = 4
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
        infos = []
        for _ in range(tensor_count):
            name = self._string()
            dims = [self._unpack("Q") for _ in range(self._unpack("I"))]
            infos.append((name, tuple(reversed(dims)), self._unpack("I"), self._unpack("Q")))
        alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        start = (self._pos + alignment - 1) // alignment * alignment
        self.tensors = {name: TensorInfo(name, shape, kind, start + offset)
                        for name, shape, kind, offset in infos}

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
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(info.ggml_type)]
        except (ValueError, KeyError):
            raise LmlabError(f"tensor {name} has ggml type {info.ggml_type}, which the gguf "
                             "package does not know",
                             "upgrade the gguf package or re-quantise the file") from None
        row_bytes = info.shape[-1] // block * type_size
        data = np.frombuffer(self._map, dtype=np.uint8, count=rows * row_bytes,
                             offset=info.offset)
        return data.reshape(*info.shape[:-1], row_bytes), info

    def tensor(self, name: str) -> np.ndarray:
        """The tensor dequantised to float32 (numpy order: rows = output features)."""
        data, info = self.raw(name)
        if info.ggml_type == _BF16:
            return (data.astype(np.uint32) << 16).view(np.float32)
        if info.ggml_type in _PLAIN_TYPES:
            return data.astype(np.float32)
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        try:
            values = dequantize(data, GGMLQuantizationType(info.ggml_type))
        except NotImplementedError:
            raise LmlabError(f"tensor {name} is {info.type_name}, which gguf cannot dequantise",
                             "re-quantise the file to a common type (Q4_0/Q4_1/Q8_0/F16)"
                             ) from None
        return values.reshape(info.shape)

    def tensor_into(self, name: str, out: np.ndarray, rows_per_chunk: int = 2048) -> None:
        """Dequantise ``name`` into the float32 array ``out`` a block of rows at a time, so a
        large table (the token embeddings) never needs more than a chunk of scratch memory."""
        data, info = self.raw(name)
        if out.shape != info.shape:
            raise LmlabError(f"{name} has shape {info.shape}, the model expects {out.shape}",
                             "the file's metadata and tensors disagree; re-convert it")
        if info.ggml_type in _PLAIN_TYPES or info.ggml_type == _BF16 or len(info.shape) != 2:
            out[...] = self.tensor(name)
            return
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        kind = GGMLQuantizationType(info.ggml_type)
        for start in range(0, info.shape[0], rows_per_chunk):
            stop = min(start + rows_per_chunk, info.shape[0])
            out[start:stop] = dequantize(data[start:stop], kind)

    def type_counts(self) -> dict[str, int]:
        """How many tensors of each ggml type the file holds (e.g. {"Q4_1": 210, ...})."""
        counts: dict[str, int] = {}
        for info in self.tensors.values():
            counts[info.type_name] = counts.get(info.type_name, 0) + 1
        return counts

    def close(self) -> None:
        self._map.close()
        self._file.close()

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_metadata(path: str | Path) -> dict[str, Any]:
    """Only the key/value metadata of a GGUF file (the tokenizer needs nothing else)."""
    with GGUFFile(path, read_tensors=False) as file:
        return dict(file.metadata)


# -- models --------------------------------------------------------------------------------------
def _family(metadata: dict[str, Any]) -> FamilySpec:
    """The family of ``general.architecture``, if its spec has GGUF names."""
    arch = metadata.get("general.architecture")
    readable = [name for name in KNOWN_FAMILIES if get_family(name).gguf_names]
    if arch not in readable:
        raise LmlabError(f"GGUF architecture {arch!r} is not supported",
                         f"lmlab reads GGUF files of: {', '.join(readable)}")
    return get_family(arch)


def config_from_gguf(metadata: dict[str, Any], tensor_names: set[str] | None = None
                     ) -> TransformerConfig:
    """A :class:`TransformerConfig` from GGUF metadata: ``<architecture>.*`` keys through the
    family's ``gguf_names``, token ids from the tokenizer's keys, biases and a tied output
    projection from which tensors the file holds."""
    spec = _family(metadata)
    arch = spec.model_type
    tensors = tensor_names or set()
    if metadata.get(f"{arch}.rope.scaling.type") not in (None, "none", "linear") \
            or metadata.get(f"{arch}.rope.scaling.factor", 1.0) not in (1.0, None) \
            or "rope_freqs.weight" in tensors:
        raise LmlabError("this GGUF uses RoPE scaling, which lmlab does not implement",
                         "use a model with plain rotary embeddings (e.g. SmolLM2, Llama 2)")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if tokens is not None:
        metadata = {f"{arch}.vocab_size": len(tokens), **metadata}
    values = spec.read(spec.gguf_names, metadata, "the GGUF metadata", prefix=f"{arch}.")
    for name, key in (("pad", "padding"), ("bos", "bos"), ("eos", "eos")):
        values[f"{name}_token_id"] = metadata.get(f"tokenizer.ggml.{key}_token_id")
    values["tie_word_embeddings"] = tensor_names is not None and "output.weight" not in tensors
    values["attention_bias"] = bool({"blk.0.attn_q.bias", "blk.0.attn_qkv.bias"} & tensors)
    return TransformerConfig(**values)


def gguf_tensor_names(config: TransformerConfig) -> dict[str, str | tuple[str, ...]]:
    """GGUF tensor name -> lmlab parameter name, from the family's Rules (the LM head's too,
    unless tied to the embeddings); a tuple of names for a fused tensor (GPT-2's
    ``attn_qkv``: the query, key and value rows concatenated along the first dimension)."""
    spec = get_family(config.family)
    rules = spec.base_rules(config) + spec.head_rules["clm"](config)
    return {rule.gguf: rule.ours for rule in expand_rules(rules, config.num_hidden_layers)
            if rule.gguf and not rule.optional}


def rotary_paired(gguf_name: str) -> bool:
    """Whether llama.cpp stores this tensor's rows for adjacent-pair rotation (the query and key
    projections): the reader undoes that layout, the writer (:mod:`lmlab.interop.gguf_writer`)
    applies it."""
    return ".attn_q." in gguf_name or ".attn_k." in gguf_name


def load_gguf_model(path: str | Path, dtype: Any = None):
    """A :class:`~lmlab.models.model.LanguageModel` with a ``"clm"`` head from a GGUF file.

    Tensors are dequantised one at a time to float32 and copied into the model (built without
    random initialisation), then the model is cast to ``dtype`` if given. The file's tokenizer
    loads with ``lmlab.Tokenizer.from_pretrained(path)``; its chat template is kept on the model
    as ``model.chat_template``.
    """
    import torch

    from lmlab.models.core.positions import RotaryEmbedding, rotary_rows_from_pairs
    from lmlab.models.model import LanguageModel

    with GGUFFile(path) as file:
        config = config_from_gguf(file.metadata, set(file.tensors))
        with torch.device("meta"):
            model = LanguageModel(config, heads=("clm",))
        model = model.to_empty(device="cpu")
        model.tie_weights()
        for module in model.modules():  # non-persistent buffers are not in the file
            if isinstance(module, RotaryEmbedding):
                module.inv_freq.copy_(RotaryEmbedding(config.head_dim, config.rope_theta).inv_freq)
        params = dict(model.named_parameters())
        names = gguf_tensor_names(config)
        missing = [n for n in names if n not in file.tensors]
        unexpected = sorted(set(file.tensors) - set(names))
        if missing or unexpected:
            raise LmlabError(
                f"{file.path} does not hold the tensors a {config.family} model needs "
                f"(missing: {missing[:8]}, unexpected: {unexpected[:8]})",
                f"use a GGUF converted from a {config.family}-architecture model")
        for theirs, ours in names.items():
            if not isinstance(ours, str):  # fused (GPT-2's attn_qkv): split the rows
                parts = [params[name] for name in ours]
                expected = (sum(p.shape[0] for p in parts), *parts[0].shape[1:])
                if expected != file.tensors[theirs].shape:
                    raise LmlabError(f"{theirs} has shape {file.tensors[theirs].shape} but the "
                                     f"metadata implies {expected}",
                                     "the file's metadata and tensors disagree; re-convert it")
                values = torch.from_numpy(np.ascontiguousarray(file.tensor(theirs)))
                with torch.no_grad():
                    for part, piece in zip(parts, values.split([p.shape[0] for p in parts]),
                                           strict=True):
                        part.copy_(piece)
                continue
            target = params[ours]
            if tuple(target.shape) != file.tensors[theirs].shape:
                raise LmlabError(f"{theirs} has shape {file.tensors[theirs].shape} but the "
                                 f"metadata implies {tuple(target.shape)}",
                                 "the file's metadata and tensors disagree; re-convert it")
            with torch.no_grad():
                if rotary_paired(theirs):
                    values = torch.from_numpy(np.ascontiguousarray(file.tensor(theirs)))
                    target.copy_(rotary_rows_from_pairs(values, config.head_dim))
                else:
                    file.tensor_into(theirs, target.detach().numpy())
        model.chat_template = file.metadata.get("tokenizer.chat_template")
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()
