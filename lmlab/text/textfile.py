"""Reading users' text files in bounded memory: 1 MiB chunks, paragraphs at blank lines.

Bytes that are not UTF-8 are an error naming the file and the byte offset *in the file*
(``errors="strict"``), or U+FFFD from there on with one :class:`CorpusWarning`
(``"replace"``); over-long paragraphs and lines are cut or skipped (docs/data.md, "Bad input").
"""

from __future__ import annotations

import codecs
import warnings
from collections.abc import Iterator
from pathlib import Path

from lmlab.text.sentences import PARAGRAPH_BREAK
from lmlab.utils.checks import check_choice
from lmlab.utils.errors import LmlabError

ENCODING_ERRORS = ("strict", "replace")
CHUNK_BYTES = 1 << 20
DEFAULT_MAX_PARAGRAPH_CHARS = 1_000_000


class CorpusWarning(UserWarning):
    """Input that lmlab could read only after repairing it (bad bytes, giant lines)."""


def check_encoding_errors(errors: str) -> None:
    """Accept only the two documented policies for bytes that are not UTF-8."""
    check_choice(errors, ENCODING_ERRORS, "--encoding-errors", "policy")


def iter_file_text(path: str | Path, chunk_bytes: int = CHUNK_BYTES,
                   errors: str = "strict") -> Iterator[str]:
    """Yield a file's decoded text in chunks (never the whole file at once). On the first byte
    that is not UTF-8 it raises (``strict``) or decodes the rest with U+FFFD and warns once
    (``replace``), naming the file and the byte's offset in the file."""
    check_encoding_errors(errors)
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    offset = 0  # bytes handed to the decoder before this block
    with open(path, "rb") as handle:
        while True:
            data = handle.read(chunk_bytes)
            pending, _flag = decoder.getstate()
            try:
                text = decoder.decode(data, final=not data)
            except UnicodeDecodeError as error:  # error.start counts from pending + data
                problem = (f"{Path(path)}: byte {offset - len(pending) + error.start} "
                           f"(0x{(pending + data)[error.start]:02x}) is not UTF-8")
                if errors == "strict":
                    raise LmlabError(problem, "convert the file (e.g. `iconv -f LATIN1 -t UTF-8`), "
                                     "or pass --encoding-errors replace to read bad bytes as "
                                     "U+FFFD") from None
                warnings.warn(f"{problem}; decoding the rest of the file with U+FFFD replacement "
                              "characters (convert it with `iconv -f LATIN1 -t UTF-8` if that "
                              "is its encoding)", CorpusWarning, stacklevel=2)
                decoder = codecs.getincrementaldecoder("utf-8")("replace")
                text = decoder.decode(pending + data, final=not data)
            offset += len(data)
            if text:
                yield text
            if not data:
                return


def iter_paragraphs(path: str | Path, max_paragraph_chars: int = DEFAULT_MAX_PARAGRAPH_CHARS,
                    chunk_bytes: int = CHUNK_BYTES, errors: str = "strict") -> Iterator[str]:
    """Yield the paragraphs of a text file (split at blank lines), in bounded memory.

    A paragraph longer than ``max_paragraph_chars`` is yielded in pieces cut at spaces, with
    one warning per file.
    """
    path = Path(path)
    buffer = ""
    warned = False
    for text in iter_file_text(path, chunk_bytes, errors):
        buffer += text
        start = 0
        for match in PARAGRAPH_BREAK.finditer(buffer):
            yield buffer[start:match.start()]
            start = match.end()
        buffer = buffer[start:]
        while len(buffer) > max_paragraph_chars:
            if not warned:
                warnings.warn(
                    f"{path}: a line or paragraph is longer than {max_paragraph_chars:,} "
                    "characters; it is read in pieces and cut into pseudo-sentences",
                    CorpusWarning, stacklevel=2)
                warned = True
            cut = buffer.rfind(" ", max_paragraph_chars // 2, max_paragraph_chars)
            if cut <= 0:
                cut = max_paragraph_chars
            yield buffer[:cut]
            buffer = buffer[cut:]
    if buffer.strip():
        yield buffer


def iter_lines(path: str | Path, max_line_chars: int = 16 * DEFAULT_MAX_PARAGRAPH_CHARS,
               chunk_bytes: int = CHUNK_BYTES,
               errors: str = "strict") -> Iterator[tuple[int, str | None]]:
    """Yield ``(line_number, line)`` for a text file in bounded memory.

    A line longer than ``max_line_chars`` is not kept: it is yielded as ``None`` (the caller
    warns and skips it) and its characters are discarded as they stream past.
    """
    buffer = ""
    number = 1
    overlong = False
    for text in iter_file_text(path, chunk_bytes, errors):
        buffer += text
        start = 0
        while True:
            newline = buffer.find("\n", start)
            if newline < 0:
                break
            too_long = overlong or newline - start > max_line_chars
            yield number, (None if too_long else buffer[start:newline])
            overlong = False
            number += 1
            start = newline + 1
        buffer = buffer[start:]
        if len(buffer) > max_line_chars:
            overlong = True
            buffer = ""
    if buffer or overlong:
        yield number, (None if overlong or len(buffer) > max_line_chars else buffer)
