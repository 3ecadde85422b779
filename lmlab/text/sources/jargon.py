"""The Jargon File 4.4.7 (Debian ``jargon-text``): one document per glossary entry plus one per
chapter and appendix (docs/data.md). In ``jargon.txt.gz`` unindented lines are chapter headings
and entries start with an indented ``:headword: pos.`` line."""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterator
from pathlib import Path

from lmlab.text.corpus import Document
from lmlab.text.sentences import text_to_sentences
from lmlab.text.sources.base import Source
from lmlab.utils.paths import find_system_path

_ENTRY = re.compile(r"^   :([^:]+):(.*)$")
_LETTER_INDEX = re.compile(r"^  \S{1,3}\s*$")
_BOX = re.compile(r"[\u2500-\u257f]")


class JargonSource(Source):
    name = "jargon"
    description = "the Jargon File 4.4.7, a document per entry or chapter"
    install_hint = "sudo apt-get install jargon-text"

    def files(self) -> list[Path]:
        path = find_system_path("usr/share/doc/jargon-text/jargon.txt.gz")
        return [path] if path else []

    def iter_documents(self) -> Iterator[Document]:
        self.require()
        with gzip.open(self.files()[0], "rt", encoding="utf-8", errors="replace") as handle:
            yield from parse_jargon(handle)


def parse_jargon(lines) -> Iterator[Document]:
    """Documents from the lines of ``jargon.txt``."""
    title: str | None = None
    body: list[str] = []
    in_index = False
    started = False  # the title page and table of contents before Chapter 1 are skipped
    seen: dict[str, int] = {}

    def flush() -> Document | None:
        if title is None or not started or title == "Glossary":
            return None
        sentences = text_to_sentences("".join(body))
        if not sentences:
            return None
        key = re.sub(r"\s+", "_", title.strip())
        seen[key] = seen.get(key, 0) + 1
        suffix = f"#{seen[key]}" if seen[key] > 1 else ""
        return Document(f"jargon/{key}{suffix}", "jargon", sentences)

    for line in lines:
        line = line.rstrip("\n")
        entry = _ENTRY.match(line)
        heading = line[:1] not in ("", " ") and not _BOX.search(line)
        if entry or heading:
            document = flush()
            if document is not None:
                yield document
            in_index = False
            if entry:
                title = entry.group(1)
                body = [f"{entry.group(1)}:{entry.group(2)}\n\n"]
            else:
                title, body = " ".join(line.split()), []
                started = started or title.startswith("Chapter 1.")
            continue
        if _LETTER_INDEX.match(line) or line.strip() == "Table of Contents":
            in_index = True
        if in_index or _BOX.search(line):
            continue
        body.append(line.replace("{", "").replace("}", "") + "\n")
    document = flush()
    if document is not None:
        yield document
