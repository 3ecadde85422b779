"""Fine-tuning end to end on tiny models: recipes, seeds, early stopping, CLI, bad input."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_close_rounding

from lmlab.finetune import data as fdata
from lmlab.finetune.recipes import discriminative_groups, layer_groups, unfreeze_to
from lmlab.finetune.runner import evaluate, finetune, finetune_seeds
from lmlab.tasks.types import Example, Task
from lmlab.utils.errors import LmlabError

WORDS = {"animal": ["dog", "cat", "horse", "bird", "fish", "cow"],
         "tool": ["hammer", "saw", "drill", "wrench", "chisel", "file"]}


@pytest.fixture(scope="module")
def tiny_folder(tiny_bert_folder):
    """A random 2-layer BERT with MiniLM's tokenizer (a real WordPiece vocabulary)."""
    return tiny_bert_folder


def toy_task(n_train: int = 96, n_dev: int = 24, task_type: str = "classification") -> Task:
    """'the X is here' -> the class of X: learnable by a tiny model in a few epochs."""
    def make(count: int, offset: int) -> list[Example]:
        out = []
        for i in range(count):
            label = "animal" if i % 2 else "tool"
            word = WORDS[label][(i // 2 + offset) % len(WORDS[label])]
            out.append(Example(id=f"{offset}-{i}", text=f"the {word} is here", label=label))
        return out

    return Task("toy", task_type, ["animal", "tool"], ["accuracy", "macro_f1"],
                {"train": make(n_train, 0), "dev": make(n_dev, 3), "test": make(n_dev, 1)})


def test_bert_recipe_learns_and_writes_run(tiny_folder, tmp_path):
    result = finetune(toy_task(), tiny_folder, tmp_path / "run", epochs=5, lr=1e-2,
                      batch_size=16, pooling="mean", patience=5, show_progress=False)
    assert result["dev"]["accuracy"] >= 0.9
    for name in ("metrics.json", "finetune.json", "predictions-dev.jsonl", "confusion-dev.png",
                 "predictions-test.jsonl", "model/config.json", "model/tokenizer.json"):
        assert (tmp_path / "run" / name).exists(), name
    assert (tmp_path / "run" / "confusion-dev.png").read_bytes()[:4] == b"\x89PNG"
    history = result["history"]
    assert result["best_epoch"] == max(history, key=lambda h: h["dev_accuracy"])["epoch"]
    again = evaluate(toy_task(), tmp_path / "run", tmp_path / "eval", ("dev",))
    assert again["dev"] == result["dev"]  # best weights were restored, saved and reloaded
    # mean pooling: lmlab's own format (transformers' classifier would pool [CLS] instead)
    config = json.loads((tmp_path / "run" / "model" / "config.json").read_text())
    assert config["model_type"] == "lmlab-native"
    assert config["lmlab_heads"] == ["sequence-classification"]
    assert config["extra"]["id2label"] == {"0": "animal", "1": "tool"}
    # a task read from a dev file that holds one class only: the model's labels are used
    only_tools = Task("toy", "classification", ["tool"], ["accuracy"],
                      {"dev": [e for e in toy_task().split("dev") if e.label == "tool"]})
    scored = evaluate(only_tools, tmp_path / "run", None, ("dev",))
    expected = [p for p in _predictions(tmp_path / "run" / "predictions-dev.jsonl")
                if p["reference"] == "tool"]
    assert scored["dev"]["accuracy"] == pytest.approx(
        sum(p["prediction"] == "tool" for p in expected) / len(expected))


def _predictions(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_seeds_summary_median_and_spread(tiny_folder, tmp_path):
    summary = finetune_seeds(toy_task(32, 8), tiny_folder, tmp_path / "seeds", seeds=(0, 1, 2),
                             epochs=1, lr=1e-3, batch_size=16, show_progress=False,
                             save_model=False)
    stats = summary["dev"]["accuracy"]
    assert stats["n"] == 3 and stats["spread"] == stats["max"] - stats["min"]
    assert sorted(stats["values"])[1] == stats["median"]
    assert (tmp_path / "seeds" / "summary.json").exists()


def test_ulmfit_groups_and_unfreezing(tiny_folder):
    from lmlab.load import from_pretrained
    from lmlab.models.task_heads import add_task_head

    model = from_pretrained(tiny_folder)
    add_task_head(model, "sequence-classification", 2, pooling="concat")
    groups = discriminative_groups(model, 1e-3, 2.6, 0.01)
    lrs = {g["depth"]: g["lr"] for g in groups}
    assert lrs[0] == pytest.approx(1e-3) and lrs[1] == pytest.approx(1e-3 / 2.6)
    assert lrs[3] == pytest.approx(1e-3 / 2.6 ** 3)  # embeddings of a 2-layer model
    assert len(layer_groups(model)) == 4
    head_only = unfreeze_to(model, 0)
    top_layer = unfreeze_to(model, 1)
    assert 0 < head_only < top_layer < unfreeze_to(model, 3) == model.num_parameters()
    assert model.transformer.embeddings.word_embeddings.weight.requires_grad


def test_ulmfit_and_feature_recipes_run(tiny_folder, tmp_path):
    ulm = finetune(toy_task(32, 8), tiny_folder, tmp_path / "ulm", recipe="ulmfit", epochs=2,
                   lr=1e-3, batch_size=16, show_progress=False, save_model=False)
    assert [h["epoch"] for h in ulm["history"]] == [1, 2]
    feat = finetune(toy_task(), tiny_folder, tmp_path / "feat", recipe="feature", epochs=40,
                    lr=5e-2, patience=40, show_progress=False)
    assert feat["dev"]["accuracy"] >= 0.75  # frozen random encoder + mix still separates
    assert len(feat["scalar_mix"]) == 3
    assert_close_rounding(sum(feat["scalar_mix"]), 1.0, terms=3)  # a float32 softmax of 3 weights
    one = finetune(toy_task(32, 8), tiny_folder, tmp_path / "feat1", recipe="feature", epochs=2,
                   layer=-1, show_progress=False, save_model=False)
    assert one["scalar_mix"] is None


def test_random_init_differs_from_pretrained(tiny_folder):
    from lmlab.finetune.runner import load_model

    pretrained, _, _ = load_model(tiny_folder)
    random_, _, _ = load_model(f"random:{tiny_folder}", seed=5)
    a = pretrained.transformer.embeddings.word_embeddings.weight
    b = random_.transformer.embeddings.word_embeddings.weight
    assert a.shape == b.shape and not torch.equal(a, b)


def test_trainer_runs_task_objective(tiny_folder, tmp_path):
    """The task objective + TaskStream follow the Trainer's interfaces."""
    from lmlab.finetune.objective import TaskObjective
    from lmlab.load import from_pretrained
    from lmlab.tokenization.tokenizer import Tokenizer
    from lmlab.training.config import TrainingConfig
    from lmlab.training.trainer import Trainer

    task = toy_task(32, 8)
    tok = Tokenizer.from_pretrained(tiny_folder)
    stream = fdata.TaskStream(fdata.encode_examples(task, task.split("train"), tok), 8,
                              tok.pad_token_id)
    model = from_pretrained(tiny_folder)
    objective = TaskObjective("classification", 2, {0: "animal", 1: "tool"})
    cfg = TrainingConfig(lr=1e-3, max_steps=3, progress=False, log_every=1)
    result = Trainer(model, objective, stream, cfg, tmp_path / "tr", track_cost=False,
                     measure_peak=False).train()
    assert result.step == 3 and result.last_loss is not None
    assert stream.state_dict()["position"] == 3


# -- data -----------------------------------------------------------------------------------------
def test_word_labels_on_first_subtoken():
    assert fdata.word_labels_to_tokens([None, 0, 0, 1, 2, 2, 2, None], [3, 1, 4]) == \
        [-100, 3, -100, 1, 4, -100, -100, -100]
    assert fdata.first_subtoken_positions([None, 0, 0, 1, None]) == {0: 1, 1: 3}


def test_tagging_and_qa_encoding(tiny_folder):
    from lmlab.tokenization.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained(tiny_folder)
    task = Task("ner", "tagging", ["O", "B-PER", "I-PER"], ["entity_f1"], {"train": [
        Example("a", tokens=["Raymondology", "wrote", "it"], tags=["B-PER", "O", "O"])]})
    (feature,) = fdata.encode_examples(task, task.split("train"), tok)
    labelled = [x for x in feature.label if x != -100]
    assert labelled == [1, 0, 0]  # one label per word, on its first sub-token
    context = "alpha beta gamma delta " * 20 + "the answer is omega here"
    start = context.index("omega")
    qa = Task("qa", "qa", [], ["exact_match"], {"train": [
        Example("q", question="what is it?", context=context,
                answers=[{"text": "omega", "answer_start": start}])]})
    feats = fdata.encode_examples(qa, qa.split("train"), tok, max_length=48, stride=16)
    assert len(feats) > 1  # document-stride windows
    found = [f for f in feats if f.label != (0, 0)]
    assert found
    s, e = found[0].label
    offsets = found[0].extra["offsets"]
    assert context[offsets[s][0]:offsets[e][1]] == "omega"


# -- bad input ------------------------------------------------------------------------------------
def test_label_outside_label_set():
    task = toy_task(4, 2)
    task.splits["dev"][0].label = "mineral"
    with pytest.raises(LmlabError, match="'mineral' is not in the label set"):
        fdata.check_examples(task, task.split("dev"), "dev")


def test_missing_column_through_cli(tmp_path):
    from lmlab.cli import main

    rows = [{"sentence": "a", "label": "x"}, {"sentence": "b", "label": "y"}]
    for name in ("train", "dev"):
        (tmp_path / f"{name}.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    code = main(["finetune", "--task", "mine", "--model", str(tmp_path), "--out",
                 str(tmp_path / "o"), "--train", str(tmp_path / "train.jsonl"), "--dev",
                 str(tmp_path / "dev.jsonl"), "--text-column", "text"])
    assert code != 0


def test_missing_column_message(tmp_path):
    from lmlab.tasks import load_table_task

    (tmp_path / "t.jsonl").write_text('{"sentence": "a", "label": "x"}\n')
    with pytest.raises(LmlabError, match="no column 'text'"):
        load_table_task("m", {"train": tmp_path / "t.jsonl"}, "text", "label")


def test_pair_task_given_single_texts():
    task = Task("p", "pair-classification", ["a", "b"], ["accuracy"],
                {"train": [Example("1", text="one", label="a")]})
    with pytest.raises(LmlabError, match="got a single text"):
        fdata.check_examples(task, task.split("train"), "train")


def test_qa_answer_not_in_context():
    task = Task("qa", "qa", [], ["exact_match"], {"train": [
        Example("q", question="who?", context="nobody is here",
                answers=[{"text": "somebody", "answer_start": 0}])]})
    with pytest.raises(LmlabError, match="does not occur in its context"):
        fdata.check_examples(task, task.split("train"), "train")


def test_empty_dev_set(tiny_folder, tmp_path):
    task = toy_task(8, 2)
    task.splits["dev"] = []
    with pytest.raises(LmlabError, match="dev split .* is empty"):
        finetune(task, tiny_folder, tmp_path / "e", epochs=1, show_progress=False)


def test_head_that_does_not_match_the_task(tiny_folder, tmp_path):
    finetune(toy_task(8, 4), tiny_folder, tmp_path / "two", epochs=1, show_progress=False)
    three = toy_task(8, 4)
    three.labels = ["animal", "tool", "mineral"]
    with pytest.raises(LmlabError, match="predicts 2 labels but task 'toy' has 3"):
        evaluate(three, tmp_path / "two")


def test_cli_finetune_and_evaluate(tiny_folder, tmp_path, capsys):
    from lmlab.cli import main

    task = toy_task(16, 6)
    for split in ("train", "dev"):
        (tmp_path / f"{split}.jsonl").write_text("\n".join(
            json.dumps({"sentence": e.text, "kind": e.label}) for e in task.splits[split]))
    common = ["--task", "toy", "--train", str(tmp_path / "train.jsonl"), "--dev",
              str(tmp_path / "dev.jsonl"), "--text-column", "sentence", "--label-column", "kind"]
    assert main(["finetune", *common, "--model", str(tiny_folder), "--out",
                 str(tmp_path / "run"), "--epochs", "1", "--batch-size", "8"]) == 0
    assert main(["evaluate", *common, "--model", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert '"accuracy"' in out
    assert (tmp_path / "run" / "eval-metrics.json").exists()
    assert (tmp_path / "run" / "eval-confusion-dev.png").exists()
