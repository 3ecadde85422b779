"""Corpus sources: the offline Debian texts of the default corpus and readers for user data;
``get_source("kjv")``, ``get_source("folder:notes/")``, ``get_source("jsonl:data.jsonl:body")``,
``get_source("sword:spaRV1909eb")`` or ``get_source("hf:NAME")`` returns a :class:`~lmlab.text.sources.base.Source`."""

from __future__ import annotations

from pathlib import Path

from lmlab.text.sources.base import Source, SourceCounts
from lmlab.text.sources.folder import FolderSource
from lmlab.text.sources.fortunes import FortunesSource
from lmlab.text.sources.gcide import GCIDESource
from lmlab.text.sources.huggingface import HuggingFaceSource
from lmlab.text.sources.jargon import JargonSource
from lmlab.text.sources.jsonl import DEFAULT_FIELD, JsonlSource
from lmlab.text.sources.kjv import KJVSource
from lmlab.text.sources.pydocs import PyDocsSource
from lmlab.text.sources.sword import SwordSource
from lmlab.text.sources.wordnet import WordNetSource
from lmlab.utils.checks import check_choice

# The built-in sources, in the order they are listed and built.
BUILTIN_SOURCES: dict[str, type[Source]] = {
    "kjv": KJVSource,
    "wordnet": WordNetSource,
    "gcide": GCIDESource,
    "fortunes": FortunesSource,
    "jargon": JargonSource,
    "pydocs": PyDocsSource,
}
USER_SOURCE_FORMS = ("folder:PATH", "jsonl:PATH[:FIELD]", "hf:NAME[:FIELD]", "sword:MODULE[:BOOKS]")

__all__ = ["BUILTIN_SOURCES", "Source", "SourceCounts", "builtin_sources", "get_source"]


def builtin_sources() -> list[Source]:
    """One instance of every built-in source, installed or not."""
    return [cls() for cls in BUILTIN_SOURCES.values()]


def _split_field(spec: str) -> tuple[str, str | None]:
    """``PATH:FIELD`` -> (PATH, FIELD) when the last ':' part is an identifier and PATH exists
    or the whole spec does not."""
    if ":" in spec:
        head, tail = spec.rsplit(":", 1)
        if tail.isidentifier() and (Path(head).expanduser().exists()
                                    or not Path(spec).expanduser().exists()):
            return head, tail
    return spec, None


def get_source(spec: str) -> Source:
    """The source named by ``spec``: a built-in name or one of ``folder:PATH``,
    ``jsonl:PATH[:FIELD]``, ``hf:NAME[:FIELD]``, ``sword:MODULE[:BOOK,BOOK]``."""
    spec = spec.strip()
    if spec in BUILTIN_SOURCES:
        return BUILTIN_SOURCES[spec]()
    kind, _, rest = spec.partition(":")
    if not rest or kind not in ("folder", "jsonl", "hf", "sword"):
        check_choice(spec, [*BUILTIN_SOURCES, *USER_SOURCE_FORMS], "--sources", "corpus source")
    if kind == "folder":
        return FolderSource(rest)
    if kind == "sword":
        module, _, books = rest.partition(":")
        return SwordSource(module, books.split(",") if books else None)
    path_or_name, field = _split_field(rest)
    if kind == "jsonl":
        return JsonlSource(path_or_name, field or DEFAULT_FIELD)
    return HuggingFaceSource(path_or_name, field or "text")
