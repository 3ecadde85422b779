"""Python's documentation in reStructuredText (Debian ``python3-doc``/``python3.11-doc``,
unpacked by ``scripts/setup.sh``): one document per section (heading) of each page.

docutils parses each ``_sources/**/*.rst.txt`` page; the prose of each section is kept and
code, tables, indexes and metadata are dropped (what is kept: docs/data.md, "Sources").
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from docutils import frontend, nodes, utils
from docutils.parsers.rst import Directive, Parser, directives, roles

from lmlab.text.corpus import Document
from lmlab.text.sentences import split_sentences
from lmlab.text.sources.base import Source
from lmlab.utils.paths import find_system_path

# Sphinx directives whose whole block is dropped (code, tables, indexes, metadata).
DROPPED_DIRECTIVES = frozenset("""
code-block code sourcecode literalinclude highlight toctree index testcode testsetup
testcleanup testoutput doctest productionlist image figure raw csv-table list-table table math
module currentmodule moduleauthor sectionauthor include audit-event audit-event-table
opcode1 tabularcolumns only literal-block parsed-literal c:namespace c:namespace-push
c:namespace-pop cpp:namespace
""".split())
# Directives whose argument is prose ('.. note:: text'), or a version then prose. Every other
# directive (function, class, describe, glossary, ...) keeps its body and drops its argument
# (an API signature, a title).
PROSE_DIRECTIVES = frozenset("note warning seealso tip important hint caution attention danger "
                             "error impl-detail".split())
VERSION_DIRECTIVES = {"versionadded": 1, "versionchanged": 1, "deprecated": 1,
                      "deprecated-removed": 2}  # how many version numbers come first

# Node types whose text is not prose: code, tables, markup targets, footnotes, parse messages.
SKIPPED_NODES = (nodes.literal_block, nodes.doctest_block, nodes.comment, nodes.target,
                 nodes.substitution_definition, nodes.footnote, nodes.citation, nodes.table,
                 nodes.image, nodes.figure, nodes.raw, nodes.math_block, nodes.rubric,
                 nodes.field_name, nodes.option_group, nodes.footnote_reference,
                 nodes.citation_reference, nodes.problematic, nodes.system_message,
                 nodes.pending)

_DIRECTIVE_NAME = re.compile(r"^\s*\.\.\s+([\w:.+-]+)::", re.MULTILINE)
_ROLE_NAME = re.compile(r":([\w:+.-]+):`")
_SETTINGS = frontend.get_default_settings(Parser)
vars(_SETTINGS).update(report_level=5, halt_level=5,  # Sphinx markup is no error here
                      file_insertion_enabled=False, raw_enabled=False, syntax_highlight="none")


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


class _AnyOptions(dict):
    """A directive option spec that accepts every option (Sphinx's ``:synopsis:``, ...)."""

    def __missing__(self, key: str):
        return directives.unchanged

    def __bool__(self) -> bool:
        return True


class _Body(Directive):
    """A Sphinx block: dropped when it is code, a table or the like (DROPPED_DIRECTIVES); else
    its body is kept and its argument dropped (an API signature, a title), except the text
    after a version directive's version number(s)."""

    optional_arguments = 1
    final_argument_whitespace = True
    has_content = True
    option_spec = _AnyOptions()

    def run(self) -> list[nodes.Node]:
        if self.name.lower() in DROPPED_DIRECTIVES:
            return []
        body = nodes.container()
        self.state.nested_parse(self.content, self.content_offset, body)
        return [*self.version_text(), body]

    def version_text(self) -> list[nodes.Node]:
        """``.. versionchanged:: 3.2 text``: the text as a paragraph (none for other blocks)."""
        versions = VERSION_DIRECTIVES.get(self.name.lower(), 0)
        parts = self.arguments[0].split(None, versions) if versions and self.arguments else []
        if len(parts) <= versions:
            return []
        inline, _messages = self.state.inline_text(parts[versions], self.lineno)
        return [nodes.paragraph(parts[versions], "", *inline)]


class _Prose(_Body):
    """``.. note:: text``: the argument is the first paragraph of the body."""

    optional_arguments = 0  # docutils then reads the argument lines as content


def _role_text(role: str, inner: str) -> str:
    """The words a Sphinx role shows: ``:func:`~os.path.join``` -> ``join``."""
    if role in ("rfc", "pep"):
        return f"{role.upper()} {inner.split('#')[0]}"
    if inner.endswith(">") and "<" in inner:
        return inner[: inner.rindex("<")].strip()
    if inner.startswith("~"):
        return inner[1:].rsplit(".", 1)[-1]
    return inner.lstrip("!")


def _role(name: str, rawtext: str, text: str, lineno: int, inliner, options=None,
          content=None) -> tuple[list[nodes.Node], list]:
    return [nodes.Text(_role_text(name, text))], []


def parse_rst(text: str) -> nodes.document:
    """The docutils tree of one page, with every Sphinx directive and role it uses registered
    (docutils' registries are global: registering a name again is harmless)."""
    for name in {name.lower() for name in _DIRECTIVE_NAME.findall(text)}:
        directives.register_directive(name, _Prose if name in PROSE_DIRECTIVES else _Body)
    for name in {name.lower() for name in _ROLE_NAME.findall(text)}:
        roles.register_local_role(name, _role)
    document = utils.new_document("<rst>", _SETTINGS)
    Parser().parse(text, document)
    return document


def _text(node: nodes.Node) -> str:
    """The prose text under ``node``; a dropped footnote reference takes its space along."""
    parts: list[str] = []
    for child in node.children:
        if isinstance(child, nodes.Text):
            parts.append(child.astext())
        elif isinstance(child, (nodes.footnote_reference, nodes.citation_reference)):
            parts[-1:] = [parts[-1].rstrip()] if parts else []
        elif not isinstance(child, SKIPPED_NODES):
            parts.append(_text(child))
    return "".join(parts)


def _paragraphs(node: nodes.Node) -> Iterator[str]:
    """Paragraph texts (paragraphs, terms, lines) under a body element, in order."""
    if isinstance(node, SKIPPED_NODES):
        return
    if isinstance(node, nodes.TextElement):
        text = _text(node)
        if text.strip():
            yield text
        return
    for child in node.children:
        if not isinstance(child, (nodes.section, nodes.title)):
            yield from _paragraphs(child)


def rst_sections(lines: Iterable[str]) -> Iterator[tuple[str, list[str]]]:
    """``(section title, prose paragraphs)`` for each section of a reST page with prose, in
    page order; text before the first heading has the title ``""``."""
    stack: list[tuple[str, nodes.Element]] = [("", parse_rst("\n".join(lines)))]
    while stack:
        title, section = stack.pop()
        paragraphs = list(_paragraphs(section))
        if paragraphs:
            yield title, paragraphs
        subsections = [child for child in section.children if isinstance(child, nodes.section)]
        stack.extend((_text(sub[0]), sub) for sub in reversed(subsections))
