"""Corpus sources: real slices of the installed Debian texts, and users' own files."""

from __future__ import annotations

import itertools
import json
import sys
import warnings

import pytest

from lmlab.text.sources import BUILTIN_SOURCES, get_source
from lmlab.text.textfile import CorpusWarning, iter_paragraphs
from lmlab.utils.errors import LmlabError

# Markup each reader must strip (the texts legitimately hold other braces and backslashes).
MARKUP = {
    "gcide": ("{", "}", "[1913 Webster]", "\\", "--Shak."),
    "jargon": ("{", "}", "═", "┌"),
    "pydocs": (":func:`", ":mod:`", "``", ".. note::", ".. index::", ">>>"),
    "wordnet": ("|", '"'),
}


def _first(source, n):
    return list(itertools.islice(source.iter_documents(), n))


@pytest.mark.parametrize("name", list(BUILTIN_SOURCES))
def test_builtin_source_yields_clean_documents(name):
    source = get_source(name)
    if not source.is_available():
        pytest.skip(f"{name} is not installed ({source.install_hint})")
    docs = _first(source, 50)
    assert len(docs) == 50
    assert len({d.id for d in docs}) == 50
    for doc in docs:
        assert doc.source == name and doc.id.startswith(f"{name}/")
        assert doc.sentences and all(s and s == " ".join(s.split()) for s in doc.sentences)
    text = " ".join(d.text for d in docs)
    for markup in MARKUP.get(name, ()):
        assert markup not in text, (name, markup)


def test_wordnet_document_is_a_synset_with_its_examples():
    source = get_source("wordnet")
    if not source.is_available():
        pytest.skip("wordnet-base is not installed")
    from lmlab.text.sources.wordnet import parse_synset_line, synset_document

    line = ("01170052 04 n 02 fight 0 fighting 0 003 @ 01169317 n 0000 | the act of fighting; "
            'any contest or struggle; "a fight broke out at the hockey game"; '
            '"there was fighting in the streets"  \n')
    doc = synset_document(parse_synset_line(line, "n"))
    assert doc.id == "wordnet/noun/01170052"
    assert doc.sentences == ["fight, fighting: the act of fighting; any contest or struggle.",
                             "a fight broke out at the hockey game",
                             "there was fighting in the streets"]


def test_gcide_markup_is_stripped():
    from lmlab.text.sources.gcide import clean_entry

    entry = ("House \\House\\ (hous), n.; pl. {Houses}. [OE. hous, hus, AS. h?s;\n"
             "   akin to G. haus.]\n"
             "   1. A structure intended or used as a habitation.\n      [1913 Webster]\n\n"
             "            Houses are built to live in; not to look on.\n"
             "                                                  --Bacon.\n"
             "      [1913 Webster]\n\n   2. (Com.) A firm, or {commercial} establishment.\n")
    assert clean_entry(entry) == [
        "House (hous), n.; pl. Houses.", "A structure intended or used as a habitation.",
        "Houses are built to live in; not to look on.",
        "(Com.) A firm, or commercial establishment."]


def test_pydocs_rst_is_stripped():
    from lmlab.text.sources.pydocs import rst_sections

    rst = """:mod:`json` --- JSON
====================

.. module:: json
   :synopsis: Encode and decode.

:func:`~json.dumps` turns *objects* into ``str``; see `the spec <https://json.org>`_.

Example::

    >>> json.dumps([1])
    '[1]'

.. note::
   Be cautious. Untrusted input is slow.

.. function:: dump(obj, fp, *, \\
                   indent=None)

   Serialize obj to fp [#f1]_.

Usage
-----

>>> 1 + 1
2

Done.
"""
    sections = list(rst_sections(rst.splitlines()))
    assert sections == [
        ("json --- JSON", ["dumps turns objects into str; see the spec.", "Example:",
                           "Be cautious. Untrusted input is slow.", "Serialize obj to fp."]),
        ("Usage", ["Done."]),
    ]


def test_fortunes_skip_index_files_and_split_on_percent():
    source = get_source("fortunes")
    if not source.is_available():
        pytest.skip("fortunes is not installed")
    names = {p.name for p in source.files()}
    assert names and not any(n.endswith((".dat", ".u8")) for n in names)
    assert "ascii-art" not in names
    docs = _first(source, 5)
    assert all("%" != s for d in docs for s in d.sentences)


def test_unknown_source_lists_valid_names():
    with pytest.raises(LmlabError) as info:
        get_source("wikipedia")
    message = str(info.value)
    assert "wikipedia" in message and "kjv" in message and "folder:PATH" in message


def test_folder_source_reads_txt_and_md(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("Hello there. General Kenobi.\n\nNew paragraph here.\n")
    (tmp_path / "sub" / "b.md").write_text("# Title\n\n- item one\n\n```\ncode = 1\n```\n\nText.\n")
    (tmp_path / "ignored.json").write_text("{}")
    source = get_source(f"folder:{tmp_path}")
    docs = list(source.iter_documents())
    assert [d.sentences for d in docs] == [
        ["Hello there.", "General Kenobi.", "New paragraph here."],
        ["Title", "item one", "Text."]]
    assert docs[1].id.endswith("/sub/b.md")


def test_folder_without_text_files_is_an_error(tmp_path):
    (tmp_path / "data.csv").write_text("a,b\n")
    source = get_source(f"folder:{tmp_path}")
    with pytest.raises(LmlabError, match="no .txt or .md files"):
        list(source.iter_documents())
    with pytest.raises(LmlabError, match="not a folder"):
        list(get_source(f"folder:{tmp_path / 'missing'}").iter_documents())


def test_non_utf8_bytes_are_an_error_or_replaced_naming_file_and_offset(tmp_path):
    from lmlab.text.sources.folder import FolderSource

    path = tmp_path / "latin1.txt"
    path.write_bytes(b"Caf" + b"\xe9 is open. " + "Ünïcode stays.".encode())
    with pytest.raises(LmlabError, match=r"(?s)latin1\.txt: byte 3 \(0xe9\) is not UTF-8.*"
                                         r"--encoding-errors replace"):
        list(get_source(f"folder:{tmp_path}").iter_documents())  # strict by default
    source = FolderSource(tmp_path, encoding_errors="replace")
    with pytest.warns(CorpusWarning, match=r"latin1\.txt: byte 3 \(0xe9\) is not UTF-8"):
        docs = list(source.iter_documents())
    assert docs[0].sentences == ["Caf\ufffd is open.", "Ünïcode stays."]


def test_bad_byte_offset_is_exact_across_chunk_boundaries(tmp_path):
    path = tmp_path / "x.txt"
    path.write_bytes(b"ab" + "é".encode() * 10 + b"\xff tail")  # bad byte at offset 22
    with pytest.raises(LmlabError, match="byte 22 "):
        "".join(iter_paragraphs(path, chunk_bytes=3))  # strict; splits 'é' across chunks
    with pytest.warns(CorpusWarning, match="byte 22 "):
        text = "".join(iter_paragraphs(path, chunk_bytes=3, errors="replace"))
    assert text == "ab" + "é" * 10 + "\ufffd tail"


def _big_line_file(path, megabytes):
    sentence = b"lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod. "
    with open(path, "wb") as handle:
        for _ in range(megabytes * (1 << 20) // len(sentence)):
            handle.write(sentence)  # one single line, no newline at all


def _check_big_line(tmp_path, megabytes):
    path = tmp_path / "big.txt"
    _big_line_file(path, megabytes)
    source = get_source(f"folder:{tmp_path}")
    documents = sentences = 0
    with pytest.warns(CorpusWarning, match="longer than 1,000,000 characters"):
        for doc in source.iter_documents():
            documents += 1
            sentences += len(doc.sentences)
            assert sum(len(s) for s in doc.sentences) <= 1_000_000  # bounded per document
            assert max(len(s) for s in doc.sentences) <= 2000
    assert documents >= megabytes
    assert sentences >= megabytes * (1 << 20) // 2000


def test_single_20mb_line_is_processed_in_bounded_pieces(tmp_path):
    _check_big_line(tmp_path, 20)


@pytest.mark.slow
def test_single_100mb_line_is_processed_in_bounded_pieces(tmp_path):
    _check_big_line(tmp_path, 100)


def test_jsonl_source_with_field_and_errors(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps({"body": "One. Two.\n\nThree."}) + "\n\n"
                    + json.dumps({"body": ["A list.", "Of sentences. Here."]}) + "\n")
    docs = list(get_source(f"jsonl:{path}:body").iter_documents())
    assert [d.sentences for d in docs] == [["One.", "Two.", "Three."],
                                           ["A list.", "Of sentences.", "Here."]]
    assert docs[1].id.endswith(":body/3")
    with pytest.raises(LmlabError, match=r"data\.jsonl:1 has no field 'text' \(body\)"):
        list(get_source(f"jsonl:{path}").iter_documents())
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok."}\nnot json\n')
    with pytest.raises(LmlabError, match=r"bad\.jsonl:2 is not JSON"):
        list(get_source(f"jsonl:{bad}").iter_documents())


def test_jsonl_overlong_line_is_an_error_naming_file_and_line(tmp_path):
    from lmlab.text.sources.jsonl import JsonlSource

    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"text": "Kept."}) + "\n" + json.dumps({"text": "x " * 5000}))
    source = JsonlSource(path, max_line_chars=1000)
    with pytest.raises(LmlabError, match=r"(?s)long\.jsonl:2 is longer than 1,000.*split"):
        list(source.iter_documents())  # never silently dropped


def test_hf_source_without_datasets_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed (lm_eval pulls it)
    source = get_source("hf:imdb")
    assert not source.is_available()
    with pytest.raises(LmlabError, match=r"pip install lmlab\[datasets\]"):
        list(source.iter_documents())


def test_counts_are_cached_until_files_change(tmp_path, monkeypatch):
    monkeypatch.setenv("LMLAB_CACHE", str(tmp_path / "cache"))
    (tmp_path / "t").mkdir()
    text_file = tmp_path / "t" / "a.txt"
    text_file.write_text("One two. Three.\n")
    source = get_source(f"folder:{tmp_path / 't'}")
    assert source.cached_counts() is None
    counts = source.counts()
    assert (counts.documents, counts.sentences, counts.words) == (1, 2, 3)
    assert source.cached_counts() == counts
    text_file.write_text("One two three four. Five six.\n")
    assert source.cached_counts() is None  # size changed: recount
    assert source.counts().words == 6
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert get_source(f"folder:{tmp_path / 't'}").cached_counts().words == 6
