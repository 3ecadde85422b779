"""Read the fortune-cookie database (Debian ``fortunes`` + ``fortunes-min``) by category: entries
separated by ``%`` lines; index, UTF-8 copy and offensive files skipped; overstriking removed.
"""

from __future__ import annotations

import re
from pathlib import Path

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


def category_files(folder: Path | None = None) -> list[Path]:
    """The category files: plain files that are not indexes, UTF-8 copies or offensive."""
    folder = folder or fortunes_dir()
    files = []
    for path in sorted(folder.iterdir()):
        if not path.is_file() or path.suffix in (".dat", ".u8") or path.name.endswith("-o"):
            continue
        if path.name.startswith(".") or path.name in ("off",):
            continue
        files.append(path)
    return files


def clean_entry(text: str) -> str:
    """An entry without overstriking and surrounding blank lines (inner layout kept)."""
    text = _OVERSTRIKE.sub("", text).replace("\x08", "")
    return text.strip("\n").rstrip()


def read_fortunes(path: Path) -> list[str]:
    """The non-empty entries of one category file."""
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
    cleaned = (clean_entry(e) for e in entries)
    return [e for e in cleaned if e.strip()]


def read_all_fortunes(folder: Path | None = None) -> dict[str, list[str]]:
    """``{category: entries}`` for every category file."""
    return {path.name: read_fortunes(path) for path in category_files(folder)}
