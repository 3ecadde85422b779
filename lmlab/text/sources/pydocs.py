"""Python's documentation in reStructuredText (Debian ``python3-doc``/``python3.11-doc``,
unpacked by ``scripts/setup.sh``): one document per section (heading) of each page.

The sources under ``usr/share/doc/python3*/html/_sources/**/*.rst.txt`` are prose mixed with
markup. :func:`rst_to_paragraphs` keeps the prose and drops the rest:

- code: literal blocks after ``::``, ``>>>`` sessions, and directives that hold code, tables,
  indexes or metadata (``code-block``, ``toctree``, ``index``, ``productionlist``, ...);
- the bodies of prose directives (``note``, ``warning``, ``versionchanged``, ``function``, ...)
  are kept without the directive line and its ``:option:`` lines;
- tables, comments and link targets are dropped; list markers are removed;
- inline markup: ``:func:`~os.path.join``` becomes ``join``, ```text <url>`_`` becomes
  ``text``, double back-quotes and ``*emphasis*`` lose their marks, footnote references go.

Sections become documents because a page can run to 20,000 words about many topics; a section
is one topic, which is what next-sentence / sentence-order objectives want from a document.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from lmlab.text.corpus import Document
from lmlab.text.sentences import split_sentences
from lmlab.text.sources.base import Source
from lmlab.utils.paths import find_system_path

# Directives whose whole block is dropped (code, tables, indexes, metadata).
DROPPED_DIRECTIVES = frozenset("""
code-block code sourcecode literalinclude highlight toctree index testcode testsetup
testcleanup testoutput doctest productionlist image figure raw csv-table list-table table math
module currentmodule moduleauthor sectionauthor include audit-event audit-event-table
opcode1 tabularcolumns only include literal-block c:namespace c:namespace-push
c:namespace-pop cpp:namespace
""".split())

# Directives that describe an API: the signature (up to the first blank line) is dropped.
SIGNATURE_DIRECTIVES = frozenset("""
function method class attribute data exception decorator decoratormethod classmethod
staticmethod abstractmethod coroutinefunction coroutinemethod awaitablefunction
awaitablemethod describe envvar option cmdoption opcode pdbcommand property
2to3fixer monitoring-event
""".split())
# Directives whose argument is prose ('.. note:: text') or a version then prose.
PROSE_ARGUMENT = frozenset("note warning seealso tip important hint caution attention danger "
                           "error impl-detail".split())
VERSION_ARGUMENT = frozenset("versionadded versionchanged deprecated deprecated-removed".split())

_DIRECTIVE = re.compile(r"^(\s*)\.\.\s+([\w:.-]+)::(.*)$")
_COMMENT = re.compile(r"^(\s*)\.\.(\s|$)")
_ADORNMENT = re.compile(r"^([=\-~^\"'*+#`:.<>_])\1{2,}\s*$")
_OPTION = re.compile(r"^\s+:[\w-]+:(\s|$)")
_LIST_MARKER = re.compile(r"^(\s*)(?:[-*+•]|#\.|\d{1,3}\.|\(?[a-zA-Z0-9]\))\s+")
_FIELD = re.compile(r"^(\s*):[^:`]+:\s+")
_TABLE_BORDER = re.compile(r"^\s*=+(\s+=+)+\s*$")
_GRID_LINE = re.compile(r"^\s*[+|]")

_ROLE = re.compile(r":([\w:+.-]+):`([^`]*)`")
_LINK = re.compile(r"`([^`<]*?)\s*<[^`>]*>`__?")
_NAMED_REF = re.compile(r"`([^`]+)`__?")
_LITERAL = re.compile(r"``(.+?)``")
_STRONG = re.compile(r"\*\*(.+?)\*\*")
_EMPHASIS = re.compile(r"(?<![\w*\\])\*(\S(?:.*?\S)?)\*(?![\w*])")
_FOOTNOTE_REF = re.compile(r"\s*\[(?:#[\w-]*|\d+|\*)\]_")
_SUBSTITUTION = re.compile(r"\|(\w[\w -]*)\|")
_INTERPRETED = re.compile(r"`([^`]+)`")


class PyDocsSource(Source):
    name = "pydocs"
    description = "Python 3 documentation (reST sources), a document per section"
    install_hint = ("run `make setup` (unpacks python3.11-doc into ~/.cache/lmlab/debian), or "
                    "`apt-get download python3.11-doc && dpkg-deb -x python3.11-doc_*.deb "
                    "~/.cache/lmlab/debian`")

    def root(self) -> Path | None:
        found = find_system_path("usr/share/doc/python3*/html/_sources")
        return found.resolve() if found else None

    def files(self) -> list[Path]:
        root = self.root()
        return sorted(root.rglob("*.rst.txt")) if root else []

    def iter_documents(self) -> Iterator[Document]:
        self.require()
        root = self.root()
        for path in self.files():
            page = path.relative_to(root).as_posix()[: -len(".rst.txt")]
            with open(path, encoding="utf-8", errors="replace") as handle:
                text = handle.read()
            for number, (title, paragraphs) in enumerate(rst_sections(text.splitlines())):
                sentences = [s for p in paragraphs for s in split_sentences(p)]
                if sentences:
                    slug = re.sub(r"[^\w]+", "-", title.lower()).strip("-")[:60]
                    yield Document(f"pydocs/{page}#{number}-{slug}", "pydocs", sentences)


def _role_text(match: re.Match) -> str:
    role, inner = match.group(1), match.group(2)
    if role in ("rfc", "pep"):
        return f"{role.upper()} {inner.split('#')[0]}"
    if inner.endswith(">") and "<" in inner:
        return inner[: inner.rindex("<")].strip()
    if inner.startswith("~"):
        return inner[1:].rsplit(".", 1)[-1]
    return inner.lstrip("!")


def strip_inline(text: str) -> str:
    """Remove reST inline markup from one paragraph, keeping the words."""
    text = _ROLE.sub(_role_text, text)
    text = _LINK.sub(r"\1", text)
    text = _LITERAL.sub(r"\1", text)
    text = _NAMED_REF.sub(r"\1", text)
    text = _INTERPRETED.sub(r"\1", text)
    text = _STRONG.sub(r"\1", text)
    text = _EMPHASIS.sub(r"\1", text)
    text = _FOOTNOTE_REF.sub("", text)
    text = _SUBSTITUTION.sub(r"\1", text)
    return text.replace("\\", "")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def rst_sections(lines: Iterable[str]) -> Iterator[tuple[str, list[str]]]:
    """``(section title, prose paragraphs)`` for a reST page, markup stripped."""
    lines = list(lines)
    title = ""
    paragraphs: list[str] = []
    current: list[str] = []
    skip_indent: int | None = None  # dropping a block indented deeper than this
    literal_after: int | None = None  # a '::' paragraph at this indent: next block is code
    in_table = False
    in_doctest = False  # a '>>>' session runs to the next blank line

    def flush() -> None:
        if current:
            text = strip_inline(" ".join(current))
            if text.strip():
                paragraphs.append(text)
            current.clear()

    for i, line in enumerate(lines):
        stripped = line.strip()
        if skip_indent is not None:
            if not stripped or _indent(line) > skip_indent:
                continue
            skip_indent = None
        if not stripped:
            in_doctest = False
            flush()
            continue
        if in_doctest:
            continue
        indent = _indent(line)
        if literal_after is not None:
            if indent > literal_after:
                skip_indent = literal_after
                literal_after = None
                continue
            literal_after = None
        if _TABLE_BORDER.match(line):
            next_line = lines[i + 1].strip() if i + 1 < len(lines) else ""
            in_table = bool(next_line) if in_table else True
            flush()
            continue
        if in_table or _GRID_LINE.match(line):
            continue
        if _ADORNMENT.match(line):
            if len(current) == 1:  # the paragraph so far is a heading
                if paragraphs:
                    yield title, paragraphs
                title, paragraphs = strip_inline(current[0]), []
                current.clear()
            else:
                flush()
            continue
        directive = _DIRECTIVE.match(line)
        if directive:
            flush()
            name, argument = directive.group(2), directive.group(3).strip()
            if name in DROPPED_DIRECTIVES:
                skip_indent = indent
                continue
            j = i + 1
            if name in SIGNATURE_DIRECTIVES or name.startswith(("c:", "cpp:", "py:")):
                while j < len(lines) and lines[j].strip():  # the rest of the signature
                    lines[j] = ""
                    j += 1
            while j < len(lines) and _OPTION.match(lines[j]):  # the directive's options
                lines[j] = ""
                j += 1
            if name in VERSION_ARGUMENT:
                argument = argument.split(" ", 1)[1] if " " in argument else ""
            elif name not in PROSE_ARGUMENT:
                argument = ""
            if argument:
                current.append(argument)
            continue
        if _COMMENT.match(line):
            flush()
            skip_indent = indent
            continue
        if stripped.startswith(">>>"):
            flush()
            in_doctest = True
            continue
        marker = _LIST_MARKER.match(line) or _FIELD.match(line)
        if marker:
            flush()
            stripped = line[marker.end():].strip()
        if stripped.endswith("::"):
            literal_after = indent
            stripped = stripped[:-2].rstrip()
            stripped = stripped + ":" if stripped and not line.rstrip().endswith(" ::") else stripped
            if stripped:
                current.append(stripped)
            flush()
            continue
        current.append(stripped)
    flush()
    if paragraphs:
        yield title, paragraphs
