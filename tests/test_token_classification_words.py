"""The token-classification pipeline's default aggregation follows the model's word labelling.

A model fine-tuned here learned each word's tag on its FIRST sub-token only (the others are
-100 in the loss), so the tags it gives continuation sub-tokens mean nothing. Its config records
``word_labels: "first-subtoken"`` and the pipeline must then read one tag per word; a
checkpoint that records nothing keeps transformers' "simple" behaviour.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from conftest import tiny_bert

import lmlab
from lmlab.finetune.data import WORD_LABELS
from lmlab.utils.catalog import minilm_dir

LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
TEXT = "Wojciechowski lives in Paris."
# MiniLM's WordPiece: [CLS] wo ##j ##cie ##cho ##wski lives in paris . [SEP]
WANTED = ["O", "B-PER", "B-LOC", "O", "I-PER", "I-LOC", "O", "O", "B-LOC", "O", "O"]


def _tagger(tmp_path, word_labels: str | None):
    """A tiny BERT token classifier whose head is solved (least squares on the encoder's hidden
    states for TEXT) to give every sub-token the tag in WANTED, with a margin of 10 logits: the
    first sub-token of the name says B-PER, its continuations disagree with it."""
    source = minilm_dir()
    if source is None:
        pytest.skip("MiniLM tokenizer not available")
    from lmlab.models.task_heads import TOKEN_CLASSIFICATION, add_task_head
    from lmlab.tokenization.tokenizer import Tokenizer

    model = tiny_bert(with_pooler=None).eval()
    add_task_head(model, TOKEN_CLASSIFICATION, len(LABELS), dict(enumerate(LABELS)))
    if word_labels is not None:
        model.config.extra["word_labels"] = word_labels
    tokenizer = Tokenizer.from_pretrained(source)
    batch = tokenizer(TEXT, return_tensors="pt")
    assert tokenizer.convert_ids_to_tokens(batch["input_ids"][0].tolist())[1:6] == \
        ["wo", "##j", "##cie", "##cho", "##wski"]  # one word, five pieces
    with torch.no_grad():
        hidden = model(input_ids=batch["input_ids"], heads=[]).last_hidden_state[0]  # (T, H)
        design = torch.cat([hidden, torch.ones(len(hidden), 1)], dim=1).double()  # (T, H+1)
        target = 10.0 * torch.eye(len(LABELS))[[LABELS.index(t) for t in WANTED]].double()
        solution = torch.linalg.lstsq(design, target).solution  # (H+1, L)
        classifier = model.heads[TOKEN_CLASSIFICATION].classifier
        classifier.weight.copy_(solution[:-1].T.float())
        classifier.bias.copy_(solution[-1].float())
    folder = tmp_path / (word_labels or "unrecorded")
    lmlab.save_pretrained(model, folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                 "special_tokens_map.json"):
        if (source / name).exists():
            shutil.copy(source / name, folder / name)
    return folder


def _entities(folder, **kwargs):
    ner = lmlab.pipeline("token-classification", model=str(folder), **kwargs)
    raw = lmlab.pipeline("token-classification", model=str(folder), aggregation_strategy="none")
    assert [t["entity"] for t in raw(TEXT)] == [t for t in WANTED[1:-1] if t != "O"]
    return ner.aggregation_strategy, [(g["entity_group"], g["word"]) for g in ner(TEXT)]


def test_default_reads_one_tag_per_word_for_first_subtoken_models(tmp_path):
    strategy, groups = _entities(_tagger(tmp_path, WORD_LABELS))
    assert strategy == "first"
    assert groups == [("PER", "Wojciechowski"), ("LOC", "Paris")]


def test_default_stays_simple_when_the_model_does_not_say(tmp_path):
    folder = _tagger(tmp_path, None)
    strategy, groups = _entities(folder)
    assert strategy == "simple"  # transformers' default for checkpoints made elsewhere
    # each sub-token keeps its own tag: the name falls apart ("##cie" is O and dropped)
    assert groups == [("PER", "Wo"), ("LOC", "j"), ("PER", "cho"), ("LOC", "wski"),
                      ("LOC", "Paris")]
    # an explicit strategy still wins over the default
    assert _entities(folder, aggregation_strategy="first")[1] == \
        [("PER", "Wojciechowski"), ("LOC", "Paris")]
