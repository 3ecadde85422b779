"""Built-in tasks from the installed WordNet and fortune packages (built once per session)."""

from __future__ import annotations

import hashlib
from collections import Counter

import pytest

from lmlab.tasks import builtin
from lmlab.tasks.builtin import (
    CPU_SIZES,
    cpu_subset,
    export_eval_texts,
    list_tasks,
    load_builtin_task,
    load_full_task,
    split_of,
)
from lmlab.text.sources import wordnet
from lmlab.utils.errors import LmlabError


@pytest.fixture(scope="session")
def task_cache(tmp_path_factory):
    """A private cache with the three built-in tasks built once (a few seconds)."""
    cache = tmp_path_factory.getbasetemp() / "lmlab-task-cache"  # shared with test_baseline.py
    for name in builtin.BUILTIN_TASKS:
        load_full_task(name, cache=cache)
    return cache


@pytest.fixture(scope="session")
def full_tasks(task_cache):
    return {name: load_full_task(name, cache=task_cache) for name in builtin.BUILTIN_TASKS}


def test_list_tasks_rows(task_cache):
    rows = {row["name"]: row for row in list_tasks(cache=task_cache)}
    assert set(rows) == {"wordnet-supersense", "wordnet-wic", "fortunes-topic"}
    for row in rows.values():
        assert (row["cpu_train"], row["cpu_dev"], row["cpu_test"]) == (4000, 1000, 1000)
        assert row["full_train"] > 8 * row["full_dev"] / 2  # about 80/10/10
    assert rows["wordnet-supersense"]["classes"] == 45
    assert rows["wordnet-supersense"]["full_train"] + rows["wordnet-supersense"]["full_dev"] + \
        rows["wordnet-supersense"]["full_test"] > 117_000
    assert rows["fortunes-topic"]["classes"] == 40
    assert rows["wordnet-wic"]["type"] == "pair-classification"


def test_splits_are_hash_based_and_cpu_is_a_subset(full_tasks):
    unit = int.from_bytes(hashlib.sha256(b"split:n00001740").digest()[:8], "big") / 2.0**64
    expected = "train" if unit < 0.8 else "dev" if unit < 0.9 else "test"
    assert split_of("n00001740") == expected
    for task in full_tasks.values():
        cpu = cpu_subset(task)
        for split, size in CPU_SIZES.items():
            full_ids = {e.id for e in task.splits[split]}
            cpu_ids = [e.id for e in cpu.splits[split]]
            assert len(cpu_ids) == size and set(cpu_ids) <= full_ids
        assert not ({e.id for e in task.splits["train"]} & {e.id for e in task.splits["test"]})


def test_supersense_examples(full_tasks):
    task = full_tasks["wordnet-supersense"]
    assert task.labels[5] == "noun.animal" and len(task.labels) == 45
    example = next(e for e in task.splits["train"] + task.splits["dev"] + task.splits["test"]
                   if e.id == "n02084071")  # dog, domestic dog, Canis familiaris
    assert example.label == "noun.animal"
    assert '"' not in example.text and "barked" not in example.text  # examples removed
    assert example.text.startswith("a member of the genus Canis")


def test_wic_split_by_lemma_balanced_with_spans(full_tasks):
    task = full_tasks["wordnet-wic"]
    words = {split: {e.extra["word"] for e in task.splits[split]} for split in task.splits}
    assert not words["train"] & words["test"] and not words["train"] & words["dev"]
    labels = Counter(e.label for split in task.splits.values() for e in split)
    assert 0.4 < labels["same"] / sum(labels.values()) < 0.6
    exceptions = wordnet.read_exceptions()
    for example in task.splits["dev"][:300]:
        word, pos = example.extra["word"], example.extra["pos"]
        forms = wordnet.surface_forms(word, pos, exceptions)
        for text, key in ((example.text, "span1"), (example.text_pair, "span2")):
            start, end = example.extra[key]
            assert text[start:end].lower() in forms
        same = example.extra["synset1"] == example.extra["synset2"]
        assert example.label == ("same" if same else "different")


def test_gloss_splitting_and_inflections():
    definition, examples = wordnet.split_gloss(
        'cause to do preliminary exercises; "The coach warmed up the players"; "he warmed up"')
    assert definition == "cause to do preliminary exercises"
    assert examples == ["The coach warmed up the players", "he warmed up"]
    exceptions = wordnet.read_exceptions()

    def find(sentence: str, lemma: str, pos: str) -> tuple[int, int] | None:
        return wordnet.LemmaMatcher([lemma], pos, exceptions).find_all(sentence).get(0)

    assert find("The coach warmed up the players", "warm up", "v") == (10, 19)
    assert find("three mice ran", "mouse", "n") == (6, 10)
    assert find("she stopped it", "stop", "v") == (4, 11)
    assert find("a well-known fact", "well", "r") is None


def test_fortunes_topic(full_tasks):
    task = full_tasks["fortunes-topic"]
    assert "computers" in task.labels and "pratchett" not in task.labels  # 2 entries: dropped
    texts = [e.text for split in task.splits.values() for e in split]
    assert not any("\b" in t for t in texts)  # overstriking removed
    assert len(set(texts)) == len(texts)


def test_cache_is_used_on_second_load(task_cache, monkeypatch):
    def broken():
        raise AssertionError("rebuilt instead of reading the cache")

    sources = builtin.BUILTIN_TASKS["fortunes-topic"][1]
    monkeypatch.setitem(builtin.BUILTIN_TASKS, "fortunes-topic", (broken, sources))
    task = load_builtin_task("fortunes-topic", "cpu", cache=task_cache)
    assert len(task.split("train")) == 4000
    assert list((task_cache / "tasks").glob("fortunes-topic-*.json.gz"))


def test_export_eval_texts(task_cache, tmp_path, full_tasks):
    out = tmp_path / "exclude.txt"
    count = export_eval_texts(["fortunes-topic", "wordnet-wic"], out, cache=task_cache)
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == count and len(set(lines)) == count
    dev_fortune = full_tasks["fortunes-topic"].splits["test"][0].text
    assert " ".join(dev_fortune.split()) in lines
    train_only = {" ".join(e.text.split()) for e in full_tasks["fortunes-topic"].splits["train"]}
    assert not train_only & set(lines)
    with pytest.raises(LmlabError, match="unknown built-in task"):
        export_eval_texts(["nope"], out, cache=task_cache)


def test_cli_tasks_list_and_export(task_cache, tmp_path, monkeypatch, capsys):
    from lmlab.cli import main

    monkeypatch.setenv("LMLAB_CACHE", str(task_cache))
    assert main(["tasks", "list"]) == 0
    out = capsys.readouterr().out
    assert "wordnet-wic" in out and "4000/1000/1000" in out
    target = tmp_path / "eval.txt"
    assert main(["tasks", "export-texts", "--task", "wordnet-supersense", "--splits", "test",
                 "--out", str(target)]) == 0
    assert len(target.read_text().splitlines()) > 10_000
    assert main(["tasks", "export-texts", "--task", "wordnet-wic", "--splits", "valid",
                 "--out", str(target)]) == 2
