"""A user's JSON-lines file (``--sources jsonl:PATH[:FIELD]``): a document per line.

Each line is a JSON object; its ``FIELD`` (default ``text``) holds the document's text, which
is split into paragraphs at blank lines and then into sentences. A field holding a list of
strings is taken as the document's sentences (each still normalised and split). Blank lines are
skipped. A line that is not JSON or lacks the field is an error naming the file and line.
A non-UTF-8 byte is an error naming the file and byte offset unless ``encoding_errors`` is
``"replace"``. A line longer than ``max_line_chars`` (16M characters) is an error naming the
file and line (never silently dropped): such a record is split into several lines.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from lmlab.text.corpus import Document
from lmlab.text.sentences import record_sentences
from lmlab.text.sources.base import Source
from lmlab.text.textfile import check_encoding_errors, iter_lines
from lmlab.utils.errors import LmlabError

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

    def is_available(self) -> bool:
        return self.path.is_file()

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
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise LmlabError(f"{self.path}:{number} is not JSON ({error.msg})",
                                 "write one JSON object per line") from None
            if not isinstance(record, dict) or self.field not in record:
                keys = ", ".join(sorted(record)) if isinstance(record, dict) else "not an object"
                raise LmlabError(f"{self.path}:{number} has no field {self.field!r} ({keys})",
                                 f"name the text field: jsonl:{self.path}:FIELD")
            value = record[self.field]
            sentences = record_sentences(value)
            if sentences:
                yield Document(f"{self.name}/{number}", self.name, sentences)
