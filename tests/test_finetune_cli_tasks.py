"""``lmlab finetune`` reaches every task type and reader, end to end, on tiny data.

Each test writes a small task in the reader's real format, fine-tunes a tiny random BERT (with
MiniLM's real WordPiece) in a subprocess (``python -m lmlab finetune ...``), and checks that the
training loss falls, that predictions and metrics are written, and that the saved model reloads
in a fresh process: ``lmlab evaluate`` with the same task options must score the saved model
exactly as the fine-tuning run scored its best weights.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmlab.cli import main

ANIMALS = ["dog", "cat", "horse", "bird", "fish", "cow"]
TOOLS = ["hammer", "saw", "drill", "wrench", "chisel", "file"]
PEOPLE = ["Wojciechowski", "Kowalczyk", "Abernathy", "Okonkwo", "Smithson", "Rasmussen"]
PLACES = ["Paris", "London", "Berlin", "Madrid", "Rome", "Vienna"]
TRAIN = ["--epochs", "8", "--patience", "8", "--batch-size", "4", "--lr", "1e-2",
         "--pooling", "mean"]


@pytest.fixture(scope="module")
def tiny_folder(tiny_bert_folder):
    """A random 2-layer BERT with MiniLM's tokenizer (a real WordPiece vocabulary)."""
    return tiny_bert_folder


def lmlab_cli(*args: str) -> subprocess.CompletedProcess:
    """``python -m lmlab ARGS`` in a fresh process; fails the test with its stderr if it fails."""
    env = {**os.environ, "LMLAB_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1"}
    if args[0] == "finetune":  # the same numbers on every host (the default is auto)
        args = (*args, "--precision", "fp32")
    result = subprocess.run([sys.executable, "-m", "lmlab", *args], capture_output=True,
                            text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def finetune_and_reload(tiny_folder: Path, out: Path, task_args: list[str]) -> dict:
    """Fine-tune in one process, evaluate the saved model in another; returns metrics.json."""
    lmlab_cli("finetune", *task_args, "--model", str(tiny_folder), "--out", str(out), *TRAIN)
    history = json.loads((out / "finetune.json").read_text())["history"]
    losses = [row["train_loss"] for row in history]
    assert len(losses) >= 2 and losses[-1] < 0.9 * losses[0], losses
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["dev"]
    rows = [json.loads(line) for line in (out / "predictions-dev.jsonl").read_text().splitlines()]
    assert rows and all("prediction" in r and "reference" in r for r in rows)
    assert (out / "model" / "config.json").is_file()

    lmlab_cli("evaluate", *task_args, "--model", str(out), "--splits", "dev")
    reloaded = json.loads((out / "eval-metrics.json").read_text())["dev"]
    # the same weights, examples and batches (64 a batch, one thread): the same predictions
    assert reloaded == metrics["dev"]
    return metrics


def _word(i: int) -> tuple[str, str]:
    label = "animal" if i % 2 else "tool"
    words = ANIMALS if label == "animal" else TOOLS
    return words[(i // 2) % len(words)], label


def test_classification_from_csv(tiny_folder, tmp_path):
    for split, count in (("train", 24), ("dev", 8)):
        lines = ["sentence,kind"] + [f'"the {w} is here, look",{k}'
                                     for w, k in map(_word, range(count))]
        (tmp_path / f"{split}.csv").write_text("\n".join(lines) + "\n")
    metrics = finetune_and_reload(tiny_folder, tmp_path / "run", [
        "--task", "kinds", "--train", str(tmp_path / "train.csv"), "--dev",
        str(tmp_path / "dev.csv"), "--text-column", "sentence", "--label-column", "kind"])
    assert set(metrics["dev"]) == {"accuracy", "f1", "macro_f1"}
    assert (tmp_path / "run" / "confusion-dev.png").is_file()


@pytest.mark.slow  # ~8 s; the task type's library path is tested in the default suite
def test_pair_classification_from_tsv(tiny_folder, tmp_path):
    for split, count in (("train", 24), ("dev", 8)):
        lines = ["first\tsecond\tsame"]
        for i in range(count):
            (a, ka), (b, kb) = _word(i), _word(i // 2 + (i % 3))
            lines.append(f"a {a} here\tand a {b} there\t{'yes' if ka == kb else 'no'}")
        (tmp_path / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    finetune_and_reload(tiny_folder, tmp_path / "run", [
        "--task", "same-kind", "--train", str(tmp_path / "train.tsv"), "--dev",
        str(tmp_path / "dev.tsv"), "--text-column", "first", "--text-pair-column", "second",
        "--label-column", "same"])


@pytest.mark.slow  # ~8 s; the task type's library path is tested in the default suite
def test_regression_from_jsonl(tiny_folder, tmp_path):
    for split, count in (("train", 24), ("dev", 8)):
        rows = []
        for i in range(count):
            word, kind = _word(i)
            rows.append({"text": f"the {word} is here", "score": 4.0 if kind == "animal"
                         else 1.0 + 0.1 * (i % 3)})
        (tmp_path / f"{split}.jsonl").write_text("\n".join(map(json.dumps, rows)) + "\n")
    metrics = finetune_and_reload(tiny_folder, tmp_path / "run", [
        "--task", "animalness", "--type", "regression", "--train",
        str(tmp_path / "train.jsonl"), "--dev", str(tmp_path / "dev.jsonl"),
        "--label-column", "score"])
    assert set(metrics["dev"]) == {"pearson", "spearman"}
    # mean pooling (TRAIN): lmlab's own format, the labels under "extra"
    config = json.loads((tmp_path / "run" / "model" / "config.json").read_text())["extra"]
    assert config["problem_type"] == "regression" and config["num_labels"] == 1


def test_glue_task_folder_by_name(tiny_folder, tmp_path):
    """An RTE folder as the GLUE download script writes it; the test file has no labels."""
    folder = tmp_path / "glue_data" / "RTE"
    folder.mkdir(parents=True)
    for split, count in (("train", 24), ("dev", 8), ("test", 4)):
        header = "index\tsentence1\tsentence2" + ("" if split == "test" else "\tlabel")
        lines = [header]
        for i in range(count):
            word, kind = _word(i)
            label = "entailment" if kind == "animal" else "not_entailment"
            row = f"{i}\tThe {word} sleeps.\tAn animal sleeps."
            lines.append(row if split == "test" else f"{row}\t{label}")
        (folder / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    args = ["--task", "rte", "--glue-dir", str(tmp_path / "glue_data")]
    metrics = finetune_and_reload(tiny_folder, tmp_path / "run", args)
    assert metrics["task"] == "glue-rte" and set(metrics["dev"]) == {"accuracy"}
    test_rows = (tmp_path / "run" / "predictions-test.jsonl").read_text().splitlines()
    assert len(test_rows) == 4 and "reference" not in json.loads(test_rows[0])
    # `lmlab baseline` takes the same task options
    assert main(["baseline", *args, "--out", str(tmp_path / "baseline")]) == 0
    assert "dev" in json.loads((tmp_path / "baseline" / "metrics.json").read_text())


def _conll_sentences(count: int, offset: int) -> str:
    """IOB1 tags, as in the original CoNLL-2003 files: an entity starts with I-."""
    blocks = ["-DOCSTART- -X- -X- O\n"]
    for i in range(count):
        person = PEOPLE[(i + offset) % len(PEOPLE)]
        place = PLACES[(i * 5 + offset) % len(PLACES)]
        blocks.append("\n".join([f"{person} NNP B-NP I-PER", "lives VBZ B-VP O",
                                 "in IN B-PP O", f"{place} NNP B-NP I-LOC", ". . O O"]) + "\n")
    return "\n".join(blocks)


def test_token_classification_from_conll(tiny_folder, tmp_path):
    (tmp_path / "eng.train").write_text(_conll_sentences(24, 0))
    (tmp_path / "eng.testa").write_text(_conll_sentences(8, 3))
    run = tmp_path / "run"
    metrics = finetune_and_reload(tiny_folder, run, [
        "--task", "ner", "--type", "tagging", "--iob1", "--train", str(tmp_path / "eng.train"),
        "--dev", str(tmp_path / "eng.testa")])
    assert set(metrics["dev"]) == {"entity_f1", "entity_precision", "entity_recall"}
    config = json.loads((run / "model" / "config.json").read_text())
    assert sorted(config["id2label"].values()) == ["B-LOC", "B-PER", "O"]  # IOB1 -> IOB2
    assert config["word_labels"] == "first-subtoken"
    first = json.loads((run / "predictions-dev.jsonl").read_text().splitlines()[0])
    assert len(first["prediction"]) == len(first["reference"]) == 5  # one tag per word
    # a fresh process's pipeline reads the labelling from the saved config
    text = "Wojciechowski and Kowalczyk live in Paris."
    code = (f"import json, lmlab; ner = lmlab.pipeline('token-classification', "
            f"model={str(run / 'model')!r}); print(ner.aggregation_strategy); "
            f"print(json.dumps([(g['start'], g['end']) for g in ner({text!r})]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    strategy, spans = out.stdout.splitlines()
    assert strategy == "first"
    for start, end in json.loads(spans):  # entities are whole words, never "Wo" + "##j..."
        assert (start == 0 or not text[start - 1].isalnum()) and not text[end].isalnum()


@pytest.mark.slow  # ~8 s; the task type's library path is tested in the default suite
def test_extractive_qa_from_squad(tiny_folder, tmp_path):
    def squad(count: int, offset: int) -> dict:
        paragraphs = []
        for i in range(count):
            animal = ANIMALS[(i + offset) % len(ANIMALS)]
            place = PLACES[(i * 5 + offset) % len(PLACES)]
            context = f"The {animal} lives in {place} with its friends."
            paragraphs.append({"context": context, "qas": [{
                "id": f"q{offset}-{i}", "question": f"Where does the {animal} live?",
                "answers": [{"text": place, "answer_start": context.index(place)}]}]})
        return {"version": "1.1", "data": [{"title": "homes", "paragraphs": paragraphs}]}

    (tmp_path / "train-v1.1.json").write_text(json.dumps(squad(24, 0)))
    (tmp_path / "dev-v1.1.json").write_text(json.dumps(squad(8, 3)))
    metrics = finetune_and_reload(tiny_folder, tmp_path / "run", [
        "--task", "homes", "--type", "qa", "--train", str(tmp_path / "train-v1.1.json"),
        "--dev", str(tmp_path / "dev-v1.1.json")])
    assert set(metrics["dev"]) == {"exact_match", "squad_f1"}


@pytest.mark.slow  # ~8 s; the task type's library path is tested in the default suite
def test_multiple_choice_from_jsonl(tiny_folder, tmp_path):
    for split, count in (("train", 24), ("dev", 8)):
        rows = []
        for i in range(count):  # which one is an animal? (the animal's place varies)
            animal, tool = ANIMALS[i % len(ANIMALS)], TOOLS[(i * 5 + 1) % len(TOOLS)]
            choices = [f"the {animal}", f"the {tool}"][::1 if i % 3 else -1]
            rows.append({"stem": "which one is an animal?", "options": choices,
                         "answer": choices.index(f"the {animal}")})
        (tmp_path / f"{split}.jsonl").write_text("\n".join(map(json.dumps, rows)) + "\n")
    metrics = finetune_and_reload(tiny_folder, tmp_path / "run", [
        "--task", "kind-choice", "--train", str(tmp_path / "train.jsonl"), "--dev",
        str(tmp_path / "dev.jsonl"), "--text-column", "stem", "--choices-column", "options",
        "--label-column", "answer"])
    assert set(metrics["dev"]) == {"accuracy"}
    config = json.loads((tmp_path / "run" / "model" / "config.json").read_text())
    assert config["lmlab_heads"] == ["multiple-choice"]  # mean pooling (TRAIN): lmlab's format


# -- bad input: a clear error before any work --------------------------------------------------
def _error(capsys, *args: str) -> str:
    assert main(list(args)) == 2
    return capsys.readouterr().err


def test_options_are_checked_before_work(tiny_folder, tmp_path, capsys):
    (tmp_path / "train.jsonl").write_text('{"sentence": "a", "label": "x"}\n')
    model = ["--model", str(tiny_folder), "--out", str(tmp_path / "out")]
    files = ["--train", str(tmp_path / "train.jsonl"), "--dev", str(tmp_path / "dev.jsonl")]
    err = _error(capsys, "finetune", "--task", "t", *files, *model)
    assert "--dev file" in err and "dev.jsonl does not exist" in err
    (tmp_path / "dev.jsonl").write_text('{"sentence": "b", "label": "x"}\n')
    err = _error(capsys, "finetune", "--task", "t", *files, *model)
    assert "no column 'text' (columns: sentence, label)" in err
    err = _error(capsys, "finetune", "--task", "t", "--train", files[1], *model)
    assert "needs a dev file" in err and "lmlab: fix: --dev FILE" in err
    err = _error(capsys, "finetune", "--task", "t", *files, "--type", "multiple-choice",
                 *model)
    assert "--choices-column" in err
    err = _error(capsys, "finetune", "--task", "t", *files, "--type", "qa", "--tag-column",
                 "1", *model)
    assert "--tag-column/--iob1 does not apply to a qa task" in err
    err = _error(capsys, "finetune", "--task", "rte", *model)
    assert "is a GLUE task" in err and "--glue-dir" in err
    err = _error(capsys, "baseline", "--task", "rte", "--glue-dir", str(tmp_path), "--type",
                 "regression", "--out", str(tmp_path / "b"))
    assert "pair-classification task, not regression" in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "b").exists()


def test_reader_errors_name_the_problem(tmp_path):
    from lmlab.tasks import load_task
    from lmlab.utils.errors import LmlabError

    (tmp_path / "mc.jsonl").write_text(json.dumps({"text": "x", "choices": ["a", "b"],
                                                   "label": 2}) + "\n")
    with pytest.raises(LmlabError, match="label 2 is not the index of one of its 2 choices"):
        load_task("m", train=tmp_path / "mc.jsonl", choices_column="choices")
    (tmp_path / "mixed.jsonl").write_text("\n".join(json.dumps(r) for r in (
        {"text": "x", "choices": ["a", "b"], "label": 0},
        {"text": "y", "choices": ["a", "b", "c"], "label": 1})) + "\n")
    with pytest.raises(LmlabError, match="different numbers of choices"):
        load_task("m", train=tmp_path / "mixed.jsonl", choices_column="choices")
    (tmp_path / "two.conll").write_text("John B-PER\nsleeps O\n")
    with pytest.raises(LmlabError, match="tag column 3 is not among the 1 tag columns"):
        load_task("n", train=tmp_path / "two.conll", task_type="tagging", tag_column=3)
    swag = tmp_path / "swag.csv"
    swag.write_text("startphrase,ending0,ending1,label\nHe opens,the door,the sky,0\n")
    task = load_task("s", train=swag, text_column="startphrase",
                     choices_column="ending0,ending1")  # SWAG's layout: one column per choice
    assert task.type == "multiple-choice" and task.labels == ["0", "1"]
    assert task.split("train")[0].choices == ["the door", "the sky"]
