"""The King James Bible (Debian ``bible-kjv``): one document per chapter, dumped with the
package's own ``bible -l 100000 "gen1:1-rev22:21"``; verse numbers dropped, each verse split
into sentences (a verse is the natural unit of this text, so one may end in ':' or ',')."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from lmlab.text.corpus import Document
from lmlab.text.sentences import split_sentences
from lmlab.text.sources.base import Source
from lmlab.utils.errors import LmlabError

_CHAPTER = re.compile(r"^(\S.*?) (\d+)$")
_VERSE = re.compile(r"^\s+(\d+) (.*)$")


class KJVSource(Source):
    name = "kjv"
    description = "King James Bible, a document per chapter"
    install_hint = "sudo apt-get install bible-kjv bible-kjv-text"

    def files(self) -> list[Path]:
        program = shutil.which("bible")
        if program is None:
            raise LmlabError("the `bible` program is not installed", self.install_hint)
        return [Path(program), Path("/usr/lib/bible.data")]

    def iter_documents(self) -> Iterator[Document]:
        self.require()
        result = subprocess.run(["bible", "-l", "100000", "gen1:1-rev22:21"],
                                capture_output=True, text=True, encoding="utf-8", check=False)
        if result.returncode != 0 or not result.stdout.strip():
            raise LmlabError(f"`bible` failed: {result.stderr.strip()[:200]}",
                             "reinstall it: sudo apt-get install --reinstall bible-kjv-text")
        yield from parse_bible_dump(result.stdout)


def parse_bible_dump(text: str) -> Iterator[Document]:
    """Documents (one per chapter) from the output of ``bible -l 100000 RANGE``."""
    book = chapter = None
    sentences: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        verse = _VERSE.match(line)
        if verse and book is not None:
            sentences.extend(split_sentences(verse.group(2)))
            continue
        heading = _CHAPTER.match(line)
        if heading:
            if book is not None and sentences:
                yield Document(f"kjv/{book}/{chapter}", "kjv", sentences)
            book, chapter = heading.group(1).replace(" ", "_"), heading.group(2)
            sentences = []
    if book is not None and sentences:
        yield Document(f"kjv/{book}/{chapter}", "kjv", sentences)
