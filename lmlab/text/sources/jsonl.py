"""A user's JSON-lines file (``--sources jsonl:PATH[:FIELD]``): a document per line.

``FIELD`` (default ``text``) holds a string (split into paragraphs, then sentences) or a list
of strings. Lines are read in bounded memory with the file's ``encoding_errors`` policy
(:mod:`lmlab.text.textfile`), which is why this reader does not use ``iter_jsonl``: a line
over ``max_line_chars`` is an error naming the file and line, never dropped silently.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from lmlab.text.corpus import Document
from lmlab.text.sentences import record_sentences
from lmlab.text.sources.base import Source
from lmlab.text.textfile import check_encoding_errors, iter_lines
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import json_record

DEFAULT_FIELD = "text"
DEFAULT_MAX_LINE_CHARS = 16_000_000


class JsonlSource(Source):
    description = "your JSON lines, a document per line"

    def __init__(self, path: str | Path, field: str = DEFAULT_FIELD,
                 max_line_chars: int = DEFAULT_MAX_LINE_CHARS, encoding_errors: str = "strict"):
        check_encoding_errors(encoding_errors)
        self.path = Path(path).expanduser()
        self.encoding_errors = encoding_errors
        self.field = field
        self.max_line_chars = max_line_chars
        self.name = f"jsonl:{path}" + (f":{field}" if field != DEFAULT_FIELD else "")
        self.install_hint = f"check that {self.path} exists"

    def files(self) -> list[Path]:
        if not self.path.is_file():
            raise LmlabError(f"{self.path} is not a file", "give --sources jsonl:PATH[:FIELD] "
                             "with PATH a file of JSON objects, one per line")
        return [self.path]

    def iter_documents(self) -> Iterator[Document]:
        self.files()
        for number, line in iter_lines(self.path, max_line_chars=self.max_line_chars,
                                       errors=self.encoding_errors):
            if line is None:
                raise LmlabError(f"{self.path}:{number} is longer than "
                                 f"{self.max_line_chars:,} characters",
                                 "split that record into several JSON lines (a document "
                                 "each); longer lines cannot be parsed in bounded memory")
            if not line.strip():
                continue
            record = json_record(line, f"{self.path}:{number}")
            if not isinstance(record, dict) or self.field not in record:
                keys = ", ".join(sorted(record)) if isinstance(record, dict) else "not an object"
                raise LmlabError(f"{self.path}:{number} has no field {self.field!r} ({keys})",
                                 f"name the text field: jsonl:{self.path}:FIELD")
            value = record[self.field]
            sentences = record_sentences(value)
            if sentences:
                yield Document(f"{self.name}/{number}", self.name, sentences)
