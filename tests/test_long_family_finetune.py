"""`lmlab finetune` of BigBird and XLNet on extractive QA (SQuAD files) and token
classification (CoNLL files): tiny random folders with MiniLM's WordPiece beside them; the loss
falls, the saved model is the family's transformers class (nothing missing or left random), and
transformers' logits on a padded batch equal lmlab's reading of the run's model. BigBird's QA
run records the tokenizer's separator, by which its class finds the question."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import assert_parity, run_lmlab

import lmlab
from lmlab.models.model import LanguageModel
from lmlab.models.presets import family_config, preset
from lmlab.models.task_heads import task_logits
from lmlab.models.xlnet import XLNetModel

transformers = pytest.importorskip("transformers")

ANIMALS = ["dog", "cat", "horse", "bird", "fish", "cow"]
PEOPLE = ["Wojciechowski", "Kowalczyk", "Abernathy", "Okonkwo"]
PLACES = ["Paris", "London", "Berlin", "Madrid", "Rome", "Vienna"]
SHAPE = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=64)
PREFIX = {"big_bird": "BigBird", "xlnet": "XLNet"}
CLASSES = {"qa": "ForQuestionAnswering", "tagging": "ForTokenClassification"}


def _squad(count: int, offset: int) -> dict:
    paragraphs = []
    for i in range(count):
        animal, place = ANIMALS[(i + offset) % 6], PLACES[(i * 5 + offset) % 6]
        context = f"The {animal} lives in {place} with its friends."
        paragraphs.append({"context": context, "qas": [{
            "id": f"q{offset}-{i}", "question": f"Where does the {animal} live?",
            "answers": [{"text": place, "answer_start": context.index(place)}]}]})
    return {"version": "1.1", "data": [{"title": "homes", "paragraphs": paragraphs}]}


def _conll(count: int, offset: int) -> str:
    blocks = []
    for i in range(count):
        person, place = PEOPLE[(i + offset) % 4], PLACES[(i * 5 + offset) % 6]
        blocks.append("\n".join([f"{person} NNP B-NP B-PER", "lives VBZ B-VP O",
                                 "in IN B-PP O", f"{place} NNP B-NP B-LOC", ". . O O"]) + "\n")
    return "\n".join(blocks)


def _folder(family: str, tiny_bert_folder, root):
    torch.manual_seed(0)
    if family == "xlnet":
        model = XLNetModel(preset("xlnet", "tiny", **SHAPE))
    else:  # blocks of 2: the QA rows (about 20 tokens) take the sparse path
        model = LanguageModel(family_config("big_bird", **SHAPE, max_position_embeddings=64,
                                            block_sparse={"block_size": 2,
                                                          "num_random_blocks": 1}))
    folder = lmlab.save_pretrained(model, root / family)
    for name in tiny_bert_folder.iterdir():
        if name.name.startswith(("tokenizer", "vocab", "special_tokens")):
            shutil.copy(name, folder / name.name)
    return folder


# tagging: a second instance (the token heads' parity and BigBird's pooler are tested in
# test_big_bird_heads.py, XLNet's in test_xlnet.py), ~10 s each
@pytest.mark.parametrize("family,kind", [
    ("big_bird", "qa"), ("xlnet", "qa"),
    *(pytest.param(family, "tagging", marks=pytest.mark.slow) for family in ("big_bird", "xlnet"))])
def test_finetune_qa_and_tagging(tiny_bert_folder, tmp_path, family, kind):
    folder = _folder(family, tiny_bert_folder, tmp_path)
    if kind == "qa":
        for split, count, offset in (("train", 16, 0), ("dev", 4, 3)):
            (tmp_path / f"{split}.json").write_text(json.dumps(_squad(count, offset)))
        files = ["--type", "qa", "--train", tmp_path / "train.json", "--dev", tmp_path / "dev.json"]
    else:
        for split, count, offset in (("train", 16, 0), ("dev", 4, 1)):
            (tmp_path / f"{split}.txt").write_text(_conll(count, offset))
        files = ["--type", "tagging", "--train", tmp_path / "train.txt", "--dev",
                 tmp_path / "dev.txt"]
    out = tmp_path / "run"
    result = run_lmlab("finetune", "--task", "t", *files, "--model", folder, "--out", out,
                       "--epochs", 4, "--patience", 4, "--batch-size", 4, "--lr", 1e-2,
                       "--precision", "fp32")
    assert result.returncode == 0, result.stderr[-3000:]
    losses = [row["train_loss"] for row in json.loads((out / "finetune.json").read_text())
              ["history"]]
    assert losses[-1] < 0.9 * losses[0], losses
    saved = json.loads((out / "model" / "config.json").read_text())
    name = PREFIX[family] + CLASSES[kind] + ("Simple" if (family, kind) == ("xlnet", "qa") else "")
    assert saved["architectures"] == [name]
    if family == "big_bird" and kind == "qa":
        assert saved["sep_token_id"] == 102  # MiniLM's [SEP]
    theirs, info = getattr(transformers, name).from_pretrained(out / "model",
                                                                output_loading_info=True)
    assert not any(info.values()), info
    ours = lmlab.from_pretrained(out / "model")
    ids = torch.tensor([[101, 2073, 2515, 1996, 3899, 2444, 1029, 102, 1996, 3899, 3268, 1999,
                         3000, 1012, 102, 0], [101, 2073, 2515, 1996, 4937, 2444, 1029, 102,
                                                1996, 4937, 3268, 1999, 2414, 2007, 1012, 102]])
    batch = {"input_ids": ids, "attention_mask": (ids != 0).long()}
    with torch.no_grad():
        got = task_logits(ours, "question-answering" if kind == "qa" else
                          "token-classification", batch)
        out = theirs.eval()(**batch)
    want = torch.stack([out.start_logits, out.end_logits], -1) if kind == "qa" else out.logits
    real = batch["attention_mask"].bool()
    if family == "big_bird" and kind == "qa":  # the question's logits sit near -1e6 in both
        real[:, 1:8] = False
    assert_parity(got, want, f"{family} {kind}", real)
