"""safetensors files: a reader that ``readinto``s each tensor with plain reads (safetensors'
memory map counts the touched pages on top of the model: two copies), and state-dict files that
store tied tensors once (:func:`save_state` / :func:`load_state`).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

from lmlab.utils.errors import LmlabError

DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}
_MAX_HEADER = 100 * 1024 * 1024


class SafetensorsFile:
    """Random access to the tensors of one ``.safetensors`` file."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._handle = open(self.path, "rb")  # noqa: SIM115 - closed by close()
        raw = self._handle.read(8)
        if len(raw) != 8:
            raise LmlabError(f"{self.path} is not a safetensors file (too short)",
                             "re-download or re-save the checkpoint")
        (header_size,) = struct.unpack("<Q", raw)
        if header_size > _MAX_HEADER:
            raise LmlabError(f"{self.path} is not a safetensors file (header of {header_size} bytes)",
                             "re-download or re-save the checkpoint")
        try:
            header = json.loads(self._handle.read(header_size))
        except json.JSONDecodeError as error:
            raise LmlabError(f"{self.path} has a corrupt safetensors header ({error})",
                             "re-download or re-save the checkpoint") from None
        self.metadata = header.pop("__metadata__", {}) or {}
        self._entries = header
        self._data_start = 8 + header_size

    def keys(self) -> list[str]:
        return list(self._entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._entries[name]["shape"])

    def get_tensor(self, name: str) -> torch.Tensor:
        entry = self._entries[name]
        if entry["dtype"] not in DTYPES:
            raise LmlabError(f"{self.path}: tensor {name} has unsupported dtype {entry['dtype']}",
                             "convert the checkpoint to F32, F16 or BF16")
        start, end = entry["data_offsets"]
        tensor = torch.empty(entry["shape"], dtype=DTYPES[entry["dtype"]])
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes != end - start:
            raise LmlabError(f"{self.path}: tensor {name} has {end - start} bytes for shape "
                             f"{entry['shape']} ({nbytes} expected)", "the file is corrupt")
        if nbytes:
            self._handle.seek(self._data_start + start)
            view = memoryview(tensor.view(-1).view(torch.uint8).numpy())
            if self._handle.readinto(view) != nbytes:
                raise LmlabError(f"{self.path} ends inside tensor {name}",
                                 "the file is truncated: re-download or re-save it")
        return tensor

    def close(self) -> None:
        self._handle.close()


# -- tensors with shared storage ----------------------------------------------------------------
def split_tied(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Drop every tensor that shares storage with an earlier one (safetensors refuses shared
    tensors); returns (unique tensors, {alias: kept name})."""
    unique: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    owners: dict[tuple[int, int, tuple[int, ...]], str] = {}
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if tensor.numel() and key in owners:
            aliases[name] = owners[key]
            continue
        owners[key] = name
        unique[name] = tensor.detach().contiguous().cpu()
    return unique, aliases


def save_state(state: dict[str, torch.Tensor], path: Path) -> None:
    """Write a state dict to a safetensors file (tied tensors stored once, aliases in metadata)."""
    from safetensors.torch import save_file

    unique, aliases = split_tied(state)
    save_file(unique, str(path), metadata={"lmlab_aliases": json.dumps(aliases)})


def load_state(path: Path) -> dict[str, torch.Tensor]:
    """Read a file written by :func:`save_state`, re-creating the aliased entries."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
    aliases = json.loads(metadata.get("lmlab_aliases", "{}"))
    state = load_file(str(path))
    for alias, owner in aliases.items():
        state[alias] = state[owner]
    return state
