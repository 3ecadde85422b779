"""WordNet 3.0 glosses (Debian ``wordnet-base``): one document per synset, ``lemma, lemma:
definition.`` then its quoted examples (each line of ``data.{noun,verb,adj,adv}`` is a synset,
its gloss after ``|``)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from lmlab.text.corpus import Document
from lmlab.text.sentences import normalize_text, split_sentences
from lmlab.text.sources.base import Source
from lmlab.utils.paths import find_system_path

PARTS_OF_SPEECH = ("noun", "verb", "adj", "adv")
_EXAMPLE = re.compile(r'"([^"]*)"')


class WordNetSource(Source):
    name = "wordnet"
    description = "WordNet 3.0 glosses and examples, a document per synset"
    install_hint = "sudo apt-get install wordnet-base"

    def files(self) -> list[Path]:
        paths = [find_system_path(f"usr/share/wordnet/data.{pos}") for pos in PARTS_OF_SPEECH]
        return [p for p in paths if p is not None] if all(paths) else []

    def iter_documents(self) -> Iterator[Document]:
        self.require()
        for pos, path in zip(PARTS_OF_SPEECH, self.files()):
            with open(path, encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    document = parse_synset_line(line, pos)
                    if document is not None:
                        yield document


def parse_synset_line(line: str, pos: str) -> Document | None:
    """A document from one line of a WordNet data file (None for the license header)."""
    if line.startswith("  ") or "|" not in line:
        return None
    fields, gloss = line.split("|", 1)
    parts = fields.split()
    offset, word_count = parts[0], int(parts[3], 16)
    lemmas = [parts[4 + 2 * i].replace("_", " ") for i in range(word_count)]
    lemmas = [re.sub(r"\((?:a|p|ip)\)$", "", lemma) for lemma in lemmas]  # adj. markers
    examples = [normalize_text(e) for e in _EXAMPLE.findall(gloss)]
    definition = normalize_text(_EXAMPLE.sub("", gloss)).strip(" ;")
    definition = re.sub(r"\s*;(\s*;)+", ";", definition).strip(" ;")
    sentences = []
    if definition:
        text = f"{', '.join(dict.fromkeys(lemmas))}: {definition}"
        sentences.append(text if text.endswith((".", "!", "?")) else text + ".")
    for example in examples:
        sentences.extend(split_sentences(example))
    if not sentences:
        return None
    return Document(f"wordnet/{pos}/{offset}", "wordnet", sentences)
