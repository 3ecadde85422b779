"""Atomic file writes and hashing.

A run killed mid-write must never leave a half-written file that a later run trusts, so every
file lmlab writes goes to a temporary name in the same directory and is renamed into place
(rename is atomic on POSIX file systems). The file gets the mode a plain ``open()`` would give
it (0666 less the umask), not ``mkstemp``'s private 0600: a model folder must be readable by
the server process or colleague the user's umask allows.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lmlab.utils.errors import LmlabError


def _current_umask() -> int:
    """The process's umask (reading it means setting it; it is put straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it onto ``path`` only on success.

    Example:
        >>> with atomic_path("out/model.safetensors") as tmp:
        ...     save_file(tensors, tmp)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_current_umask())  # after the writer: some replace the file
        with open(tmp, "rb+") as handle:  # make the bytes durable before the rename
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int = 2) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (sorted keys, trailing newline)."""
    atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=True, ensure_ascii=False) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    """Read a JSON file."""
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def config_has_key(folder: str | os.PathLike, key: str) -> bool:
    """Whether ``folder/config.json`` exists and has ``key`` at its top level (how lmlab tells
    its own save formats from a Hugging Face folder)."""
    config_file = Path(folder) / "config.json"
    return config_file.is_file() and key in read_json(config_file)


def sha256_file(path: str | os.PathLike, chunk_size: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes, read in chunks (bounded memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def stable_hash(obj: Any) -> str:
    """Short, stable hash of a JSON-serialisable object (config dicts, cache keys)."""
    text = json.dumps(obj, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def json_record(line: str, where: str,
                fix: str = "write one JSON object per line (JSON lines)") -> Any:
    """``line`` parsed as JSON; a line that is not JSON is refused naming ``where``
    (``path:line``), with ``fix``."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as error:
        raise LmlabError(f"{where} is not JSON ({error.msg})", fix) from None


def iter_jsonl(path: str | os.PathLike, encoding: str = "utf-8") -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for each non-blank line of a JSON-lines file: the one reader.

    A line that is not JSON, or is JSON but not an object, is refused with its line number.
    """
    with open(path, encoding=encoding) as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            record = json_record(line, f"{path}:{number}")
            if not isinstance(record, dict):
                raise LmlabError(f"{path}:{number} is a JSON {type(record).__name__}, not an "
                                 "object", "write one JSON object per line (JSON lines)")
            yield number, record
