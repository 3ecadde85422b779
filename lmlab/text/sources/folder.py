"""A user's folder of ``.txt`` / ``.md`` files (``--sources folder:PATH``): a document per file,
found recursively, read in sorted order and in bounded memory (:mod:`lmlab.text.textfile`).
Markdown loses fenced code, heading marks and list markers; a file over
``max_document_chars`` becomes several documents (``path#2``, ...)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from lmlab.text.corpus import Document
from lmlab.text.sentences import split_sentences
from lmlab.text.sources.base import Source
from lmlab.text.textfile import check_encoding_errors, iter_paragraphs
from lmlab.utils.errors import LmlabError

TEXT_SUFFIXES = (".txt", ".md")
DEFAULT_MAX_DOCUMENT_CHARS = 1_000_000
_MD_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+", re.MULTILINE)
_MD_LIST = re.compile(r"^\s*(?:[-*+]|\d{1,3}[.)])\s+", re.MULTILINE)


class FolderSource(Source):
    description = "your .txt/.md files, a document per file"

    def __init__(self, folder: str | Path, max_document_chars: int = DEFAULT_MAX_DOCUMENT_CHARS,
                 encoding_errors: str = "strict"):
        check_encoding_errors(encoding_errors)
        self.encoding_errors = encoding_errors
        self.folder = Path(folder).expanduser()
        self.name = f"folder:{folder}"
        self.max_document_chars = max_document_chars
        self.install_hint = f"check that {self.folder} exists and holds .txt or .md files"

    def files(self) -> list[Path]:
        if not self.folder.is_dir():
            raise LmlabError(f"{self.folder} is not a folder", "give --sources folder:PATH "
                             "with PATH a folder of .txt or .md files")
        files = sorted(p for p in self.folder.rglob("*")
                       if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
        if not files:
            raise LmlabError(f"{self.folder} holds no .txt or .md files",
                             "put UTF-8 text files ending in .txt or .md there (searched "
                             "recursively), or use jsonl:PATH for JSON lines")
        return files

    def is_available(self) -> bool:
        return self.folder.is_dir()

    def iter_documents(self) -> Iterator[Document]:
        for path in self.files():
            relative = path.relative_to(self.folder).as_posix()
            markdown = path.suffix.lower() == ".md"
            part, size, sentences = 1, 0, []
            in_fence = False
            for paragraph in iter_paragraphs(path, max_paragraph_chars=self.max_document_chars,
                                             errors=self.encoding_errors):
                if markdown:
                    paragraph, in_fence = _strip_markdown(paragraph, in_fence)
                if sentences and size + len(paragraph) > self.max_document_chars:
                    yield self._document(relative, part, sentences)
                    part, size, sentences = part + 1, 0, []
                sentences.extend(split_sentences(paragraph))
                size += len(paragraph)
            if sentences:
                yield self._document(relative, part, sentences)

    def _document(self, relative: str, part: int, sentences: list[str]) -> Document:
        suffix = f"#{part}" if part > 1 else ""
        return Document(f"{self.name}/{relative}{suffix}", self.name, sentences)


def _strip_markdown(paragraph: str, in_fence: bool) -> tuple[str, bool]:
    """Drop fenced code and heading/list marks from one Markdown paragraph."""
    kept = []
    for line in paragraph.split("\n"):
        if line.lstrip().startswith(("```", "~~~")):
            in_fence = not in_fence
            continue
        if not in_fence:
            kept.append(line)
    text = "\n".join(kept)
    text = _MD_HEADING.sub("", text)
    text = _MD_LIST.sub("", text)
    return text, in_fence
