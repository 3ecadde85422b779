"""Building corpus folders: split, dedup, exclusion, atomic writes, errors, CLI."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from lmlab.data.build import assign_split, build_corpus, list_sources
from lmlab.text.corpus import Document, read_corpus, read_manifest
from lmlab.text.sources import Source, get_source
from lmlab.utils.errors import LmlabError


def _need(*names):
    for name in names:
        if not get_source(name).is_available():
            pytest.skip(f"{name} is not installed")


def _jsonl(path, texts):
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return f"jsonl:{path}"


def test_build_real_slice_counts_split_and_determinism(tmp_path):
    _need("kjv", "wordnet", "fortunes")
    out = tmp_path / "corpus"
    manifest = build_corpus("kjv,wordnet,fortunes", out, validation_fraction=0.1,
                            max_documents=300)
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "train.jsonl",
                                                      "validation.jsonl"]
    assert read_manifest(out) == manifest
    train, validation = list(read_corpus(out, "train")), list(read_corpus(out, "validation"))
    assert len(train) + len(validation) == manifest["total_documents"]
    assert {d.source for d in train} == {"kjv", "wordnet", "fortunes"}
    for name, entry in manifest["sources"].items():
        for split, docs in (("train", train), ("validation", validation)):
            mine = [d for d in docs if d.source == name]
            assert entry[split]["documents"] == len(mine)
            assert entry[split]["sentences"] == sum(len(d.sentences) for d in mine)
            assert entry[split]["words"] == sum(len(s.split()) for d in mine for s in d.sentences)
    assert 0 < len(validation) < len(train)
    assert manifest["total_words"] == sum(len(s.split()) for d in train + validation
                                          for s in d.sentences)
    # the split is by document text + seed: every document is where assign_split says
    assert all(assign_split(d.text, 0, 0.1) == "validation" for d in validation)
    # no validation text occurs in train
    assert not {d.text for d in validation} & {d.text for d in train}
    # deterministic: same inputs, same bytes; another seed, another split
    again = build_corpus("kjv,wordnet,fortunes", tmp_path / "again", validation_fraction=0.1,
                         max_documents=300)
    assert again["sha256"] == manifest["sha256"]
    other = build_corpus("kjv,wordnet,fortunes", tmp_path / "other", validation_fraction=0.1,
                         max_documents=300, seed=1)
    assert other["sha256"] != manifest["sha256"]
    assert other["total_documents"] == manifest["total_documents"]


def test_exact_duplicates_removed_and_never_across_splits(tmp_path):
    texts = [f"Document number {i}. It has two sentences." for i in range(40)]
    spec = _jsonl(tmp_path / "d.jsonl", texts + texts[:15] + ["Document  number 3.  It has two "
                                                            "sentences."])
    manifest = build_corpus([spec], tmp_path / "c", validation_fraction=0.3)
    entry = manifest["sources"][spec]
    assert entry["duplicates"] == 16  # whitespace differences are normalised away
    assert manifest["duplicates_removed"] == 16
    assert manifest["total_documents"] == 40
    train = {d.text for d in read_corpus(tmp_path / "c", "train")}
    validation = [d.text for d in read_corpus(tmp_path / "c", "validation")]
    assert validation and not set(validation) & train
    assert len(train) + len(validation) == 40


def test_exclude_files_remove_whole_segments_not_substrings(tmp_path):
    docs = ["Look: the cat sat on the mat. It purred.", "A dog barked at the mailman today.",
            "Nothing to see here.", "Concatenate the strings first.", "Cat."]
    spec = _jsonl(tmp_path / "d.jsonl", docs)
    long_lines = tmp_path / "long.txt"
    long_lines.write_text("the CAT  sat on the mat\n\nbarked at the mailman\nnot present\n")
    short_lines = tmp_path / "short.txt"
    short_lines.write_text("cat\n")  # a whole segment only: never 'Concatenate'
    manifest = build_corpus([spec], tmp_path / "c", exclude=[long_lines, short_lines],
                            validation_fraction=0.0, exclude_tasks=())
    kept = [d.sentences for d in read_corpus(tmp_path / "c", "train")]
    # 'barked at the mailman' is not a whole segment of the dog sentence: kept
    assert kept == [["Look.", "It purred."], ["A dog barked at the mailman today."],
                    ["Nothing to see here."], ["Concatenate the strings first."]]
    assert [e["texts"] for e in manifest["exclude"]] == [3, 1]
    assert [e["documents_removed"] for e in manifest["exclude"]] == [0, 1]
    assert manifest["excluded_documents"] == 1 and manifest["excluded_sentences"] == 1
    assert manifest["excluded_words"] == 7  # 'the cat sat on the mat.' (6) and 'Cat.' (1)
    assert manifest["sources"][spec]["excluded"] == 1


def _naive_leaks(documents: list[list[str]], texts: list[str]) -> list[tuple[str, str]]:
    """Every (text, document text) where the text's words equal the words of a run of whole
    consecutive segments: runs grown segment by segment while they are a prefix of some text
    (the reference for the hashed index, which looks up the first words instead)."""
    wanted = {_words(t): t for t in texts if _words(t)}
    prefixes = set()
    for text in wanted:
        split = text.split(" ")
        prefixes.update(" ".join(split[:k]) for k in range(1, len(split) + 1))
    leaks = []
    for sentences in documents:
        segments = [_words(p) for s in sentences for p in re.split(r"(?<=[;:])(?=\s)", s)]
        segments = [p for p in segments if p]
        for i in range(len(segments)):
            run = segments[i]
            for j in range(i + 1, len(segments) + 1):
                if run in wanted:
                    leaks.append((wanted[run], " ".join(sentences)))
                if run not in prefixes or j == len(segments):
                    break
                run += " " + segments[j]
    return leaks


def _words(text: str) -> str:
    """Lower-cased runs of letters and digits, space-joined."""
    return " ".join(re.findall(r"\w+", text.lower()))


def test_default_corpus_slice_holds_no_dev_or_test_text_as_a_segment(tmp_path):
    _need("kjv", "wordnet", "fortunes", "gcide")
    from lmlab.tasks.builtin import BUILTIN_TASKS, eval_texts

    out = tmp_path / "corpus"
    manifest = build_corpus(["kjv", "wordnet", "fortunes", "gcide"], out, max_documents=2500,
                            validation_fraction=0.1)  # the default: tasks excluded
    texts = eval_texts(list(BUILTIN_TASKS))
    assert [e["name"] for e in manifest["exclude"]] == [f"task:{n}" for n in BUILTIN_TASKS]
    assert all(e["texts"] > 0 and len(e["sha256"]) == 64 for e in manifest["exclude"])
    assert manifest["settings"]["exclude_tasks"] == list(BUILTIN_TASKS)
    documents = [d.sentences for split in ("train", "validation")
                 for d in read_corpus(out, split)]
    assert _naive_leaks(documents, texts) == []
    # real leaks were there to remove: the same slice without exclusion holds many
    raw = build_corpus(["kjv", "wordnet", "fortunes", "gcide"], tmp_path / "raw",
                       max_documents=2500, validation_fraction=0.1, exclude_tasks="none")
    raw_documents = [d.sentences for split in ("train", "validation")
                     for d in read_corpus(tmp_path / "raw", split)]
    assert len(_naive_leaks(raw_documents, texts)) > 500
    assert raw["exclude"] == [] and raw["excluded_words"] == 0
    # what is dropped is segments: most of the text stays, every KJV chapter stays
    assert manifest["total_words"] + manifest["excluded_words"] <= raw["total_words"]
    assert manifest["total_words"] > 0.9 * raw["total_words"]
    assert manifest["sources"]["kjv"]["train"]["documents"] + \
        manifest["sources"]["kjv"]["validation"]["documents"] == 1189
    wordnet = manifest["sources"]["wordnet"]  # a synset keeps its lemmas and examples
    assert wordnet["excluded"] <= 0.01 * wordnet["read"] and wordnet["excluded_words"] > 1000


def test_a_one_word_dev_text_removes_only_a_segment_that_is_that_word(tmp_path):
    from lmlab.tasks.builtin import BUILTIN_TASKS, eval_texts

    assert "even" in eval_texts(list(BUILTIN_TASKS))  # a real one-word dev/test text
    docs = ["Seven cows came home in the evening.", "Even so, he left.", "It is an even number.",
            "They were even; nobody owed anything.", "Odd or even?"]
    spec = _jsonl(tmp_path / "d.jsonl", docs)
    build_corpus([spec], tmp_path / "c", validation_fraction=0.0)
    kept = [d.text for d in read_corpus(tmp_path / "c", "train")]
    assert kept == docs  # 'even' is never a whole segment there


def test_segment_index_agrees_with_naive_segment_runs(tmp_path):
    _need("kjv")
    import random

    from lmlab.data.exclusion import SegmentExclusion, TextSet, segment_words

    docs = [d.sentences for d in list(get_source("kjv").iter_documents())[:150]]
    rng = random.Random(0)
    texts = []
    for sentences in rng.sample(docs, 40):  # whole runs of sentences / clauses ...
        segments = [p for s in sentences for p in s.replace(": ", ":|").replace("; ", ";|")
                    .split("|")]
        start = rng.randrange(len(segments))
        texts.append(" ".join(segments[start:start + rng.randrange(1, 4)]).upper())
    for sentences in rng.sample(docs, 20):  # ... and cuts inside a sentence (no leak)
        text = rng.choice(sentences)
        texts.append(text[3:-5])
    texts += ["never in the bible at all", "LORD", "and", "of the"]
    exclusion = SegmentExclusion()
    exclusion.add(TextSet("t", "file"), texts)
    found = 0
    for sentences in docs:
        words, segments = segment_words(sentences)
        hashed = {" ".join(words[a:b]) for a, b, _ in exclusion.matches(words, segments)}
        assert hashed == {_words(t) for t, _ in _naive_leaks([sentences], texts)}
        found += len(hashed)
    assert found >= 40


class _Broken(Source):
    name = "broken"

    def files(self):
        return []

    def is_available(self) -> bool:
        return True

    def iter_documents(self) -> Iterator[Document]:
        yield Document("broken/1", "broken", ["A first sentence."])
        raise RuntimeError("disk on fire")


def test_failed_build_leaves_no_manifest_and_no_temp_folder(tmp_path):
    out = tmp_path / "c"
    spec = _jsonl(tmp_path / "d.jsonl", ["One document."])
    build_corpus([spec], out, validation_fraction=0.0)
    assert (out / "manifest.json").exists()
    with pytest.raises(LmlabError, match="already holds"):
        build_corpus([_Broken()], out)  # refused before any work
    assert (out / "manifest.json").exists()
    with pytest.raises(RuntimeError, match="disk on fire"):
        build_corpus([_Broken()], out, overwrite=True)
    assert not (out / "manifest.json").exists()  # the old corpus is no longer trusted
    assert not (out / ".tmp-build").exists()
    with pytest.raises(LmlabError, match="no manifest.json"):
        read_manifest(out)


def test_empty_corpus_is_an_error(tmp_path):
    spec = _jsonl(tmp_path / "d.jsonl", ["", "   ", "Only this."])
    exclude = tmp_path / "x.txt"
    exclude.write_text("Only this.\n")
    with pytest.raises(LmlabError, match="the corpus is empty"):
        build_corpus([spec], tmp_path / "c", exclude=[exclude])
    assert not (tmp_path / "c" / "manifest.json").exists()


def test_bad_arguments_are_clear_errors(tmp_path):
    spec = _jsonl(tmp_path / "d.jsonl", ["Text."])
    with pytest.raises(LmlabError, match="(?s)unknown corpus source 'bible'.*kjv"):
        build_corpus("bible", tmp_path / "c")
    with pytest.raises(LmlabError, match="validation fraction"):
        build_corpus([spec], tmp_path / "c", validation_fraction=1.5)
    with pytest.raises(LmlabError, match="exclude file .* does not exist"):
        build_corpus([spec], tmp_path / "c", exclude=[tmp_path / "nope.txt"])
    with pytest.raises(LmlabError, match="named twice"):
        build_corpus([spec, spec], tmp_path / "c")


def test_list_sources_rows_without_counting():
    rows = list_sources(count=False)
    assert [r["name"] for r in rows] == ["kjv", "wordnet", "gcide", "fortunes", "jargon",
                                         "pydocs"]
    for row in rows:
        assert row["installed"] or row["install_hint"]
        assert row["words"] is None


def test_cli_build_and_list(tmp_path, capsys):
    from lmlab.cli import main

    spec = _jsonl(tmp_path / "d.jsonl", [f"Sentence {i}. Another one." for i in range(20)])
    code = main(["data", "build", "--sources", spec, "--out", str(tmp_path / "c"),
                 "--validation-fraction", "0.2", "--seed", "3"])
    assert code == 0
    out = capsys.readouterr().out
    assert "words" in out and "20 documents" in out
    assert read_manifest(tmp_path / "c")["settings"]["seed"] == 3
    # the default corpus keeps the built-in tasks' dev/test texts out, and says so
    assert read_manifest(tmp_path / "c")["settings"]["exclude_tasks"] == [
        "wordnet-supersense", "wordnet-wic", "fortunes-topic"]
    assert "kept out (whole segments): task:wordnet-supersense" in out
    assert main(["data", "build", "--sources", "nope", "--out", str(tmp_path / "d")]) == 2
    assert "unknown corpus source" in capsys.readouterr().err
    assert main(["data", "list", "--no-count"]) == 0
    listing = capsys.readouterr().out
    assert "kjv" in listing and "pydocs" in listing and "folder:PATH" in listing
