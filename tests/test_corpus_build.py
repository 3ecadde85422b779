"""Building corpus folders: split, dedup, exclusion, atomic writes, errors, CLI."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from lmlab.data.build import Exclusions, assign_split, build_corpus, list_sources
from lmlab.data.corpus import Document, read_corpus, read_manifest
from lmlab.data.sources import Source, get_source
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


def test_exclude_files_remove_matching_documents(tmp_path):
    docs = ["Look: the cat sat on the mat. It purred.", "A dog barked at the mailman today.",
            "Nothing to see here.", "Concatenate the strings first.", "Keep this one."]
    spec = _jsonl(tmp_path / "d.jsonl", docs)
    long_lines = tmp_path / "long.txt"
    long_lines.write_text("the cat  sat on\n\nbarked at the mailman\nnot present anywhere\n")
    short_lines = tmp_path / "short.txt"
    short_lines.write_text("cat\n")  # a substring test: also hits 'Concatenate'
    manifest = build_corpus([spec], tmp_path / "c", exclude=[long_lines, short_lines],
                            validation_fraction=0.0)
    kept = [d.text for d in read_corpus(tmp_path / "c", "train")]
    assert kept == ["Nothing to see here.", "Keep this one."]
    assert [e["documents_removed"] for e in manifest["exclude"]] == [2, 1]
    assert [e["lines"] for e in manifest["exclude"]] == [3, 1]
    assert manifest["excluded_documents"] == 3
    assert manifest["sources"][spec]["excluded"] == 3


def test_exclusion_index_agrees_with_naive_substring_test(tmp_path):
    _need("kjv")
    import random

    docs = list(get_source("kjv").iter_documents())[:200]
    texts = [d.text for d in docs]
    rng = random.Random(0)
    lines = []
    for text in rng.sample(texts, 30):  # real substrings, cut mid-word on purpose
        start = rng.randrange(len(text) - 60)
        lines.append(text[start:start + rng.randrange(6, 60)].strip())
    lines += ["never in the bible at all", "LORD", "zz", "son of Nun", "of the"]
    path = tmp_path / "exclude.txt"
    path.write_text("\n".join(lines) + "\n")
    exclusions = Exclusions([path])
    assert exclusions.index and exclusions.short  # both paths are exercised
    for text in texts:
        assert (exclusions.match(text) is not None) == any(line in text for line in lines)


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
    with pytest.raises(RuntimeError, match="disk on fire"):
        build_corpus([_Broken()], out)
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
    assert main(["data", "build", "--sources", "nope", "--out", str(tmp_path / "d")]) == 2
    assert "unknown corpus source" in capsys.readouterr().err
    assert main(["data", "list", "--no-count"]) == 0
    listing = capsys.readouterr().out
    assert "kjv" in listing and "pydocs" in listing and "folder:PATH" in listing


def test_task_rows_hook_tolerates_only_the_missing_tasks_module(monkeypatch):
    import importlib

    from lmlab.cli import data as data_cli

    real_import = importlib.import_module

    def fake_import(name, *args):
        if name == data_cli.TASKS_MODULE:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args)

    monkeypatch.setattr(importlib, "import_module", fake_import)
    assert data_cli.task_rows() is None

    def broken_import(name, *args):
        if name == data_cli.TASKS_MODULE:
            raise ModuleNotFoundError("No module named 'somedep'", name="somedep")
        return real_import(name, *args)

    monkeypatch.setattr(importlib, "import_module", broken_import)
    with pytest.raises(ModuleNotFoundError):
        data_cli.task_rows()
