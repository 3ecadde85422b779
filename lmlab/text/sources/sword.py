"""Bibles as SWORD modules (Debian ``sword-text-kjv``, ``sword-text-sparv``, ...), read with
pysword: verses keyed by their reference, so two translations line up verse by verse, and the
corpus source ``sword:MODULE`` (a document per chapter, a sentence per verse)."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from lmlab.text.corpus import Document
from lmlab.text.sources.base import Source
from lmlab.utils.errors import LmlabError
from lmlab.utils.paths import find_system_path

INSTALL_HINT = ("install the modules and the reader: sudo apt-get install sword-text-kjv "
                "sword-text-sparv && pip install pysword (make setup does both)")
_MARKS = re.compile(r"[¶\s]+")  # paragraph marks some modules keep in the text


def sword_root() -> Path | None:
    """The folder holding ``mods.d/`` (Debian installs modules under /usr/share/sword)."""
    return find_system_path("usr/share/sword/mods.d") and find_system_path("usr/share/sword")


def _modules() -> tuple[Any, list[str]]:
    """pysword's reader of the installed modules, and their names."""
    root = sword_root()
    if root is None:
        raise LmlabError("no SWORD modules are installed", INSTALL_HINT)
    try:
        from pysword.modules import SwordModules
    except ImportError as error:
        raise LmlabError("the SWORD reader pysword is not installed", INSTALL_HINT) from error
    modules = SwordModules(str(root))
    return modules, sorted(modules.parse_modules())


def sword_modules() -> list[str]:
    """The names of the installed Bible modules (``engKJV2006eb``, ``spaRV1909eb``, ...)."""
    return _modules()[1]


def _bible(module: str) -> Any:
    modules, installed = _modules()
    if module not in installed:
        raise LmlabError(f"no SWORD module {module!r} (installed: {', '.join(installed)})",
                         "give one of the installed modules' names, or " + INSTALL_HINT)
    return modules.get_bible_from_module(module)


def bible_verses(module: str, books: Sequence[str] | None = None) -> dict[str, str]:
    """``{"Gen.1.1": text, ...}`` for every non-empty verse of ``module`` (or of the ``books``
    given by OSIS name, e.g. ``["Matt", "John"]``), markup and paragraph marks removed. Keys
    use the module's versification, so KJV and Reina-Valera 1909 share all 31,102. Read once
    per process (pysword decompresses a Bible in about a minute on a 2-core CPU)."""
    return dict(_read_verses(module, tuple(books) if books is not None else None))


@functools.lru_cache(maxsize=4)
def _read_verses(module: str, books: tuple[str, ...] | None) -> dict[str, str]:
    bible = _bible(module)
    structure = bible.get_structure().get_books()
    verses: dict[str, str] = {}
    for book in [*structure.get("ot", []), *structure.get("nt", [])]:
        if books is not None and book.osis_name not in books:
            continue
        texts = iter(bible.get_iter(books=[book.osis_name]))
        for chapter, length in enumerate(book.chapter_lengths, start=1):
            for verse in range(1, length + 1):
                text = _MARKS.sub(" ", next(texts, "")).strip()
                if text:
                    verses[f"{book.osis_name}.{chapter}.{verse}"] = text
    if books is not None and not verses:
        raise LmlabError(f"{module} has no verses in the books {', '.join(books)}",
                         "give OSIS book names such as Gen, Matt, John")
    return verses


class SwordSource(Source):
    """``sword:MODULE`` or ``sword:MODULE:BOOK,BOOK``: a Bible module (or some of its books,
    by OSIS name) as corpus documents, one per chapter."""

    description = "a SWORD Bible module, a document per chapter"
    install_hint = INSTALL_HINT

    def __init__(self, module: str, books: Sequence[str] | None = None):
        self.module, self.books = module, list(books) if books else None
        self.name = f"sword:{module}" + (f":{','.join(self.books)}" if self.books else "")

    def files(self) -> list[Path]:
        root = sword_root()
        confs = sorted(root.glob("mods.d/*.conf")) if root else []
        return [c for c in confs if c.stem.lower() == self.module.lower()][:1]

    def iter_documents(self) -> Iterator[Document]:
        self.require()
        chapters: dict[str, list[str]] = {}
        for reference, text in bible_verses(self.module, self.books).items():
            chapters.setdefault(reference.rsplit(".", 1)[0], []).append(text)
        for chapter, sentences in chapters.items():
            yield Document(f"{self.module}/{chapter.replace('.', '/')}", self.name, sentences)
