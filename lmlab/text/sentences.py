"""Sentence splitting and text normalisation for the corpus.

A rule-based splitter (one regex pass plus a few checks per candidate boundary, about 1M
words/s) rather than pysbd (37k words/s); the rules and the measurements are in docs/data.md,
"Sentences". Normalisation: Unicode NFC, whitespace runs collapsed to one space, case kept.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator

# Words that end with a dot without ending the sentence (compared lower-cased, without the dot).
ABBREVIATIONS = frozenset("""
mr mrs ms messrs mme mlle dr prof rev hon st sr jr gen col capt lt sgt cmdr adm gov sen rep
pres supt insp
e.g i.e cf viz vs al pl approx ca circa dept est fig figs vol vols no nos pp ch chap sec secs art
eq eqs ed eds trans op cit ibid
inc ltd co corp bros assn univ
jan feb apr jun jul aug sep sept oct nov dec
mt ft ave blvd rd
""".split())

# Words that often open a sentence: after a dotted acronym ("the U.S. The ...") they do break.
SENTENCE_OPENERS = frozenset("""
a an the this that these those it its he she they we i you his her their our my there here
but and or so yet however then thus in on at for if when while after before as by from
what who why how where which
""".split())

# A candidate end: terminal punctuation, closing quotes/brackets, whitespace, then the next
# sentence's first character (checked in Python).
_CANDIDATE = re.compile(r"(?:[.!?]+|…)[\"'”’)\]»]*(?=\s+([\"'“‘(\[«]*)(\S))")
_WORD_BEFORE = re.compile(r"(\S+)$")
_ENUMERATOR = re.compile(r"^(?:\(?[0-9]{1,3}[.)]|\(?[ivxlcdm]{1,5}[.)]|\(?[a-zA-Z][.)]"
                         r"|\([^\s()]{1,15}\))$")
_DOTTED_ACRONYM = re.compile(r"^(?:[A-Za-z]\.){2,}$")

PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n")  # a blank line (spaces allowed)
DEFAULT_MAX_SENTENCE_CHARS = 2000


def normalize_text(text: str) -> str:
    """NFC-normalise and collapse every whitespace run to one space (strips the ends)."""
    if not text.isascii():
        text = unicodedata.normalize("NFC", text)
    return " ".join(text.split())


def _is_boundary(text: str, start: int, end: int, seg_start: int, next_char: str,
                 next_word_start: int) -> bool:
    """Decide whether the candidate at text[start:end] (the punctuation) ends a sentence."""
    if not (next_char.isupper() or next_char.isdigit()):
        return False
    punct = text[start:end]
    if punct[0] in "!?" or punct.startswith(("…", "..")):
        return True  # '!', '?' or an ellipsis before an upper-case start
    # The word the dot belongs to, e.g. "Mr" for "Mr.", "U.S" for "U.S."
    match = _WORD_BEFORE.search(text, seg_start, start)
    if match is None:
        return False
    word = match.group(1)
    stripped = word.lstrip("\"'“‘([«")
    lower = stripped.lower()
    if lower in ABBREVIATIONS:
        if lower in ("no", "nos") and not next_char.isdigit():
            return True  # "No. 5" continues; "said no. Then" ends
        return False
    if len(stripped) == 1 and stripped.isalpha() and stripped.isupper() and stripped != "I":
        return False  # an initial: "J. Random Hacker"
    if _DOTTED_ACRONYM.match(stripped + "."):
        next_word = text[next_word_start:next_word_start + 12].split(" ", 1)[0]
        return next_word.strip("\"'“‘(").lower() in SENTENCE_OPENERS
    # Everything since the last boundary is a lone enumerator or label: "1.", "(a)", "(Com.)".
    segment = text[seg_start:end].strip()
    if " " not in segment and _ENUMERATOR.match(segment):
        return False
    return True


def _chop(sentence: str, max_chars: int) -> Iterator[str]:
    """Cut an over-long sentence into pseudo-sentences of at most ``max_chars`` characters,
    at a space when there is one."""
    while len(sentence) > max_chars:
        cut = sentence.rfind(" ", max_chars // 2, max_chars + 1)
        if cut <= 0:
            cut = max_chars
        yield sentence[:cut].strip()
        sentence = sentence[cut:].strip()
    if sentence:
        yield sentence


def split_sentences(text: str, max_chars: int = DEFAULT_MAX_SENTENCE_CHARS) -> list[str]:
    """Split one paragraph into normalised sentences.

    Whitespace (newlines included) is collapsed first, so call it per paragraph when
    paragraph breaks matter. Sentences longer than ``max_chars`` are cut into pseudo-sentences
    at spaces (bounded size for text without punctuation).

    >>> split_sentences('Mr. Smith went to Washington, D.C. on 2.5 days\\' notice. "Why?" he asked.')
    ["Mr. Smith went to Washington, D.C. on 2.5 days' notice.", '"Why?" he asked.']
    """
    text = normalize_text(text)
    if not text:
        return []
    sentences: list[str] = []
    seg_start = 0
    for match in _CANDIDATE.finditer(text):
        start, end = match.start(), match.end()
        if start < seg_start:
            continue
        next_word_start = match.start(2) - len(match.group(1))
        if _is_boundary(text, start, end, seg_start, match.group(2), next_word_start):
            sentence = text[seg_start:end].strip()
            if sentence:
                sentences.extend(_chop(sentence, max_chars))
            seg_start = end
    tail = text[seg_start:].strip()
    if tail:
        sentences.extend(_chop(tail, max_chars))
    return sentences


def split_paragraphs(text: str) -> list[str]:
    """Split text into paragraphs at blank lines (lines holding only whitespace)."""
    return [p for p in PARAGRAPH_BREAK.split(text) if p.strip()]


def text_to_sentences(text: str, max_chars: int = DEFAULT_MAX_SENTENCE_CHARS) -> list[str]:
    """Paragraphs at blank lines, then sentences within each paragraph."""
    sentences: list[str] = []
    for paragraph in split_paragraphs(text):
        sentences.extend(split_sentences(paragraph, max_chars))
    return sentences


def record_sentences(value: object) -> list[str]:
    """Sentences of one record's text field: a string, or a list of strings (one per item)."""
    if isinstance(value, list):
        return [s for item in value for s in split_sentences(str(item))]
    return text_to_sentences(str(value or ""))
