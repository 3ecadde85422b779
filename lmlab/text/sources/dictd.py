"""dictd dictionaries (Debian ``dict-*`` packages): the ``.index`` file gives each headword's
byte offset and length in the ``.dict.dz`` text as base-64 numbers. GCIDE (a monolingual
source) and the FreeDict bilingual dictionaries (seed and test pairs for aligning two
languages' word vectors) are both read through it."""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterator
from pathlib import Path

from lmlab.utils.errors import LmlabError
from lmlab.utils.paths import find_system_path

_B64 = {c: i for i, c in
        enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}
_PRONUNCIATION = re.compile(r"\s*/[^/\n]*/\s*$")
_SENSE = re.compile(r"^\s*\d+\.\s*")


def dictd_number(text: str) -> int:
    """A dictd index number (base 64, most significant digit first)."""
    value = 0
    for char in text:
        value = value * 64 + _B64[char]
    return value


def dictd_entries(data_path: Path, index_path: Path) -> Iterator[tuple[str, str]]:
    """``(headword, entry text)`` for every entry of the index, in index order (the
    ``00-database-*`` metadata entries skipped)."""
    with gzip.open(data_path, "rb") as handle:
        data = handle.read()
    with open(index_path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 3 or parts[0].startswith("00database") or parts[0].startswith("00-"):
                continue
            start, length = dictd_number(parts[1]), dictd_number(parts[2])
            yield parts[0], data[start:start + length].decode("utf-8", errors="replace")


def freedict_pairs(source: str = "eng", target: str = "spa", both_directions: bool = True
                   ) -> list[tuple[str, str]]:
    """One-word ``(source, target)`` translation pairs from FreeDict (Debian's
    ``dict-freedict-eng-spa`` and ``-spa-eng``), lower-cased, in dictionary order, without
    repeats: ``[("water", "agua"), ...]``. With ``both_directions`` only the pairs both
    dictionaries give are kept: FreeDict's eng-spa has multi-word headwords cut to their first
    word (an entry "one" that translates "one hundred" as "ciento"), and the reverse
    dictionary drops most of them. Multi-word translations are left out."""
    pairs = _one_way_pairs(f"{source}-{target}")
    if both_directions:
        reverse = {(b, a) for a, b in _one_way_pairs(f"{target}-{source}")}
        pairs = [pair for pair in pairs if pair in reverse]
    return pairs


def _one_way_pairs(languages: str) -> list[tuple[str, str]]:
    data = find_system_path(f"usr/share/dictd/freedict-{languages}.dict.dz")
    index = find_system_path(f"usr/share/dictd/freedict-{languages}.index")
    if data is None or index is None:
        raise LmlabError(f"the FreeDict dictionary {languages} is not installed",
                         f"sudo apt-get install dict-freedict-{languages} (make setup does it)")
    pairs: dict[tuple[str, str], None] = {}
    for headword, text in dictd_entries(data, index):
        lines = text.strip().splitlines()
        if not lines or " " in headword.strip():
            continue
        source = headword.strip().lower()
        for line in lines[1:]:  # the first line repeats the headword and its pronunciation
            for translation in _SENSE.sub("", _PRONUNCIATION.sub("", line)).split(","):
                target = translation.strip().lower()
                if target and target.isalpha():
                    pairs[(source, target)] = None
    return list(pairs)
