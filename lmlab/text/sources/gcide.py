"""GCIDE 0.48, the Collaborative International Dictionary of English (Debian ``dict-gcide``,
unpacked by ``scripts/setup.sh``): one document per entry, Webster markup stripped
(docs/data.md lists what goes). ``gcide.index`` gives each headword's byte offset in
``gcide.dict.dz`` (base-64 numbers), which marks where entries start."""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterator
from pathlib import Path

from lmlab.text.corpus import Document
from lmlab.text.sentences import split_sentences
from lmlab.text.sources.base import Source
from lmlab.text.sources.dictd import dictd_number
from lmlab.utils.paths import find_system_path

_PRONUNCIATION = re.compile(r"\s*\\[^\\\n]*\\")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_ATTRIBUTION = re.compile(r"\s--\s*[A-Z][^\n]*$", re.MULTILINE)
_BRACED = re.compile(r"\{([^{}]*)\}")
_SENSE_NUMBER = re.compile(r"^[ \t]*(?:\d{1,2}\.|\([a-z]\))[ \t]+", re.MULTILINE)
_SYLLABLE_MARKS = re.compile(r"(?<=\w)[*\"`'](?=\w)")


class GCIDESource(Source):
    name = "gcide"
    description = "GCIDE dictionary (Webster's 1913 + additions), a document per entry"
    install_hint = ("run `make setup` (unpacks dict-gcide into ~/.cache/lmlab/debian), or "
                    "`apt-get download dict-gcide && dpkg-deb -x dict-gcide_*.deb ~/.cache/lmlab/debian`")

    def files(self) -> list[Path]:
        data = find_system_path("usr/share/dictd/gcide.dict.dz")
        index = find_system_path("usr/share/dictd/gcide.index")
        return [data, index] if data and index else []

    def iter_documents(self) -> Iterator[Document]:
        self.require()
        data_path, index_path = self.files()
        starts: dict[int, str] = {}
        with open(index_path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                parts = line.rstrip("\n").split("\t")
                if len(parts) != 3 or parts[0].startswith("00-"):
                    continue
                starts.setdefault(dictd_number(parts[1]), parts[0])
        with gzip.open(data_path, "rb") as handle:
            data = handle.read()  # 40 MB; a fixed dictionary, not user data
        offsets = sorted(starts)
        seen: dict[str, int] = {}
        for i, offset in enumerate(offsets):
            end = offsets[i + 1] if i + 1 < len(offsets) else len(data)
            text = data[offset:end].decode("utf-8", errors="replace")
            sentences = clean_entry(text)
            if not sentences:
                continue
            word = starts[offset].replace(" ", "_")
            seen[word] = seen.get(word, 0) + 1
            suffix = f"#{seen[word]}" if seen[word] > 1 else ""
            yield Document(f"gcide/{word}{suffix}", "gcide", sentences)


def _unbrace(match: re.Match) -> str:
    return _SYLLABLE_MARKS.sub("", match.group(1))


def clean_entry(text: str) -> list[str]:
    """Sentences of one GCIDE entry with the dictd/Webster markup removed."""
    text = _PRONUNCIATION.sub("", text)
    for _ in range(3):  # nested brackets, innermost first
        text, count = _BRACKETS.subn("", text)
        if not count:
            break
    text = _ATTRIBUTION.sub("", text)
    text = _BRACED.sub(_unbrace, text)
    text = _SENSE_NUMBER.sub("\n\n", text)  # each numbered sense is its own paragraph
    sentences: list[str] = []
    for paragraph in re.split(r"\n\s*\n", text):
        if paragraph.lstrip().startswith("Syn:"):
            continue  # synonym lists, not sentences
        for sentence in split_sentences(paragraph):
            if sentence.strip(" .,;:-") and any(ch.isalpha() for ch in sentence):
                sentences.append(sentence)
    return sentences
