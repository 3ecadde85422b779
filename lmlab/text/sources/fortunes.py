"""Fortune cookies (Debian ``fortunes``, ``fortunes-min``): one document per fortune
(entries separated by ``%`` lines; index files, ``off/`` and ``ascii-art`` skipped)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from lmlab.text.corpus import Document
from lmlab.text.sentences import text_to_sentences
from lmlab.text.sources.base import Source
from lmlab.utils.paths import find_system_path

SKIPPED_FILES = {"ascii-art"}


class FortunesSource(Source):
    name = "fortunes"
    description = "fortune cookies (43 categories), a document per fortune"
    install_hint = "sudo apt-get install fortunes fortunes-min"

    def files(self) -> list[Path]:
        folder = find_system_path("usr/share/games/fortunes")
        if folder is None:
            return []
        return sorted(
            path for path in folder.iterdir()
            if path.is_file() and not path.is_symlink() and path.suffix not in (".dat", ".u8")
            and path.name not in SKIPPED_FILES
        )

    def iter_documents(self) -> Iterator[Document]:
        self.require()
        for path in self.files():
            with open(path, encoding="utf-8", errors="replace") as handle:
                entry: list[str] = []
                number = 0
                for line in handle:
                    if line.rstrip("\r\n") == "%":
                        number += 1
                        document = _document(path.name, number, entry)
                        if document is not None:
                            yield document
                        entry = []
                    else:
                        entry.append(line)
                document = _document(path.name, number + 1, entry)
                if document is not None:
                    yield document


def _document(category: str, number: int, lines: list[str]) -> Document | None:
    sentences = text_to_sentences("".join(lines).expandtabs())
    if not sentences:
        return None
    return Document(f"fortunes/{category}/{number}", "fortunes", sentences)
