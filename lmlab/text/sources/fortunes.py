"""The fortune-cookie database (Debian ``fortunes``, ``fortunes-min``): entries separated by ``%``
lines, one file per category. One reader serves the ``fortunes`` corpus source (a document per
fortune, ``ascii-art`` skipped) and the ``fortunes-topic`` task (entries by category, overstriking
removed): each cleans the raw entries its own way."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from lmlab.text.corpus import Document
from lmlab.text.sentences import text_to_sentences
from lmlab.text.sources.base import Source
from lmlab.utils.errors import LmlabError
from lmlab.utils.paths import find_system_path

_OVERSTRIKE = re.compile(r".\x08")


def fortunes_dir() -> Path:
    """The installed fortune database folder."""
    path = find_system_path("usr/share/games/fortunes")
    if path is None or not path.is_dir():
        raise LmlabError("the fortune database (/usr/share/games/fortunes) is not installed",
                         "install the Debian packages fortunes and fortunes-min")
    return path


def category_files(folder: Path | None = None, skip: Iterable[str] = ()) -> list[Path]:
    """The category files, sorted: plain files (no symlinks) that are not indexes (``.dat``),
    UTF-8 copies (``.u8``), offensive (``-o``), hidden, or named in ``skip``."""
    folder = folder or fortunes_dir()
    skipped = set(skip)
    return [path for path in sorted(folder.iterdir())
            if path.is_file() and not path.is_symlink() and path.suffix not in (".dat", ".u8")
            and not path.name.endswith("-o") and not path.name.startswith(".")
            and path.name not in skipped]


def read_entries(path: Path) -> list[str]:
    """Every entry of one category file, raw and in order (empty ones too, so an entry's
    number is its position)."""
    raw = path.read_bytes().decode("utf-8", errors="replace")
    entries = []
    current: list[str] = []
    for line in raw.splitlines():
        if line.strip() == "%":
            entries.append("\n".join(current))
            current = []
        else:
            current.append(line)
    entries.append("\n".join(current))
    return entries


def clean_entry(text: str) -> str:
    """An entry without overstriking and surrounding blank lines (inner layout kept)."""
    text = _OVERSTRIKE.sub("", text).replace("\x08", "")
    return text.strip("\n").rstrip()


def read_all_fortunes(folder: Path | None = None) -> dict[str, list[str]]:
    """``{category: cleaned non-empty entries}`` for every category file (the task's view)."""
    by_category = {}
    for path in category_files(folder):
        cleaned = (clean_entry(entry) for entry in read_entries(path))
        by_category[path.name] = [entry for entry in cleaned if entry.strip()]
    return by_category


class FortunesSource(Source):
    name = "fortunes"
    description = "fortune cookies (43 categories), a document per fortune"
    install_hint = "sudo apt-get install fortunes fortunes-min"
    skipped_files = ("ascii-art",)  # pictures, not sentences

    def files(self) -> list[Path]:
        return category_files(skip=self.skipped_files)

    def iter_documents(self) -> Iterator[Document]:
        self.require()
        for path in self.files():
            for number, entry in enumerate(read_entries(path), 1):
                sentences = text_to_sentences(entry.expandtabs())
                if sentences:
                    yield Document(f"fortunes/{path.name}/{number}", "fortunes", sentences)
