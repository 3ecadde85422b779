"""The TF-IDF baseline on small synthetic tasks, on real WordNet WiC, and through the CLI."""

from __future__ import annotations

import json
import random

import pytest

from lmlab.tasks.baseline import run_tfidf_baseline
from lmlab.tasks.types import Example, Task
from lmlab.utils.errors import LmlabError

WORDS = {"sport": ["goal", "match", "team", "score", "coach"],
         "food": ["bread", "cheese", "soup", "salad", "spice"],
         "law": ["court", "judge", "appeal", "statute", "jury"]}


def _topic_task(n_train=90, n_dev=30):
    rng = random.Random(0)
    filler = ["the", "a", "of", "and", "today", "again"]

    def make(n, prefix):
        out = []
        for i in range(n):
            label = list(WORDS)[i % 3]
            words = rng.sample(WORDS[label], 2) + rng.sample(filler, 3)
            rng.shuffle(words)
            out.append(Example(id=f"{prefix}{i}", text=" ".join(words), label=label))
        return out

    return Task("topics", "classification", sorted(WORDS), ["accuracy", "macro_f1"],
                {"train": make(n_train, "tr"), "dev": make(n_dev, "dv"), "test": make(n_dev, "te")})


def test_baseline_learns_a_separable_task():
    result = run_tfidf_baseline(_topic_task(), return_predictions=True)
    assert result["dev"]["accuracy"] == 1.0 and result["test"]["accuracy"] == 1.0
    assert result["chosen"] in (0.1, 1.0, 10.0, 100.0) and set(result["grid"]) == {
        "0.1", "1.0", "10.0", "100.0"}
    assert len(result["predictions"]["test"]) == 30


def test_pair_classification_uses_both_texts():
    # label = whether the two texts share their topic word: invisible from either side alone
    rng = random.Random(1)
    nouns = [f"word{i}" for i in range(12)]

    def make(n, prefix):
        out = []
        for i in range(n):
            a = rng.choice(nouns)
            same = i % 2 == 0
            b = a if same else rng.choice([x for x in nouns if x != a])
            out.append(Example(id=f"{prefix}{i}", text=f"about {a}", text_pair=f"on {b}",
                               label="same" if same else "different"))
        return out

    task = Task("pairs", "pair-classification", ["different", "same"], ["accuracy", "f1"],
                {"train": make(400, "tr"), "dev": make(100, "dv")}, positive_label="same")
    assert run_tfidf_baseline(task)["dev"]["accuracy"] > 0.9


def test_regression_uses_ridge():
    rng = random.Random(2)

    def make(n, prefix):
        out = []
        for i in range(n):
            k = rng.randint(0, 5)
            text = " ".join(["good"] * k + ["bad"] * (5 - k) + [rng.choice(["x", "y", "z"])])
            out.append(Example(id=f"{prefix}{i}", text=text, text_pair="ref", label=float(k)))
        return out

    task = Task("reg", "regression", [], ["pearson", "spearman"],
                {"train": make(200, "tr"), "dev": make(50, "dv")})
    result = run_tfidf_baseline(task)
    assert result["param"] == "alpha" and result["dev"]["pearson"] > 0.9


def test_baseline_bad_input():
    task = _topic_task()
    task.splits["dev"] = []
    with pytest.raises(LmlabError, match="dev split .* is empty"):
        run_tfidf_baseline(task)
    tagging = Task("ner", "tagging", ["O"], ["entity_f1"],
                   {"train": [Example("1", tokens=["a"], tags=["O"])],
                    "dev": [Example("2", tokens=["b"], tags=["O"])]})
    with pytest.raises(LmlabError, match="does not handle tagging"):
        run_tfidf_baseline(tagging)
    pair = Task("p", "pair-classification", ["0", "1"], ["accuracy"],
                {"train": [Example("1", text="a", label="0"), Example("2", text="b", label="1")],
                 "dev": [Example("3", text="c", label="0")]})
    with pytest.raises(LmlabError, match="example 1: a pair task got a single text"):
        run_tfidf_baseline(pair)


@pytest.fixture(scope="session")
def task_cache(tmp_path_factory):
    """The task cache test_tasks_builtin.py fills (same folder, and tasks already loaded in
    this process are reused), so WordNet is parsed once per session."""
    return tmp_path_factory.getbasetemp() / "lmlab-task-cache"


def test_baseline_on_real_wordnet_wic(task_cache):
    from lmlab.tasks.builtin import load_builtin_task

    task = load_builtin_task("wordnet-wic", "cpu", cache=task_cache)
    result = run_tfidf_baseline(task, grid=(0.1,))
    assert result["sizes"] == {"train": 4000, "dev": 1000, "test": 1000}
    assert 0.53 < result["dev"]["accuracy"] < 0.75  # above chance, far from solved


def test_cli_baseline_from_files(tmp_path):
    from lmlab.cli import main

    task = _topic_task()
    for split in ("train", "dev"):
        with open(tmp_path / f"{split}.jsonl", "w") as handle:
            for e in task.splits[split]:
                handle.write(json.dumps({"sentence": e.text, "topic": e.label}) + "\n")
    out = tmp_path / "run"
    code = main(["baseline", "--task", "topics", "--train", str(tmp_path / "train.jsonl"),
                 "--dev", str(tmp_path / "dev.jsonl"), "--text-column", "sentence",
                 "--label-column", "topic", "--out", str(out)])
    assert code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["dev"]["accuracy"] == 1.0 and metrics["model"] == "tfidf+logreg"
    rows = [json.loads(line) for line in (out / "predictions-dev.jsonl").read_text().splitlines()]
    assert len(rows) == 30 and rows[0]["prediction"] == rows[0]["label"]
    assert main(["baseline", "--task", "topics", "--train", str(tmp_path / "train.jsonl"),
                 "--dev", str(tmp_path / "dev.jsonl"), "--label-column", "stars",
                 "--out", str(out)]) == 2


@pytest.mark.slow
def test_documented_cpu_baseline_figures(task_cache):
    """The figures recorded in docs/tasks.md (slow: about 25 s of fitting)."""
    from lmlab.tasks.builtin import load_builtin_task

    expected = {"wordnet-supersense": 0.541, "wordnet-wic": 0.579, "fortunes-topic": 0.397}
    for name, dev_accuracy in expected.items():
        result = run_tfidf_baseline(load_builtin_task(name, "cpu", cache=task_cache))
        assert result["dev"]["accuracy"] == pytest.approx(dev_accuracy, abs=0.005)  # tol: 3 decimals; a fit, per host
