"""BigBird's token classification and question answering against transformers 5.23
(BigBirdForTokenClassification, which holds a pooler it does not read; BigBirdForQuestionAnswering,
whose qa_classifier runs a feed-forward block before qa_outputs and pushes the question's logits
down by 1e6): both ways on random weights moved off their initialisation, padded batches, at a
length that takes the block-sparse path (eval, its deterministic pattern) and one that falls back
to dense; the question found by the separator or given as question_lengths, with and without
token types; the QA loss; a fresh process reads the saved folder."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import assert_parity, perturb

import lmlab
from lmlab.models.model import LanguageModel
from lmlab.models.presets import family_config
from lmlab.models.task_heads import add_task_head, task_logits

transformers = pytest.importorskip("transformers")

BLOCK, RANDOM, SEP = 4, 2, 66  # sparse above 36 tokens; BigBirdConfig's sep_token_id
SHAPE = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=64, max_position_embeddings=128)
HEADS = {"token-classification": "BigBirdForTokenClassification",
         "question-answering": "BigBirdForQuestionAnswering"}
LENGTHS = (50, 30)  # block-sparse (padded to 52 inside), dense fallback


def _batch(length: int, types: bool = True) -> dict[str, torch.Tensor]:
    """[CLS] question [SEP] context [SEP] rows (questions of 6 and 9 tokens), the second padded
    by 9; the separator appears nowhere else."""
    ids = torch.randint(3, SEP, (2, length), generator=torch.Generator().manual_seed(length))
    ids[:, 0] = 65
    mask = torch.ones_like(ids)
    mask[1, length - 9:] = 0
    ids[1, length - 9:] = 0
    ids[0, [6, length - 1]] = SEP
    ids[1, [9, length - 10]] = SEP
    batch = dict(input_ids=ids, attention_mask=mask)
    if types:
        segments = torch.zeros_like(ids)
        segments[0, 7:], segments[1, 10:] = 1, 1
        batch["token_type_ids"] = segments * mask
    return batch


def _theirs(model, batch: dict, head: str) -> torch.Tensor:
    model.bert.set_attention_type("block_sparse")  # a short input left it dense for good
    with torch.no_grad():
        out = model(**batch)
    if head == "question-answering":
        return torch.stack([out.start_logits, out.end_logits], -1)
    return out.logits


def _compare(ours: torch.Tensor, theirs: torch.Tensor, batch: dict, head: str, what: str) -> None:
    """Real tokens; QA: those outside the question (the question's logits sit near -1e6, where
    float32's spacing is 0.06, and must be that low on both sides)."""
    real = batch["attention_mask"].bool()
    if head == "question-answering":
        ids, lengths = batch["input_ids"], batch.get("question_lengths")
        if lengths is None:  # up to and with the first separator
            lengths = (ids == SEP).int().argmax(-1, keepdim=True) + 1
        question = torch.arange(ids.shape[1]) < lengths  # (B, T)
        question[:, 0] = False  # [CLS] stays a candidate
        masked = question[..., None].expand_as(ours)
        assert bool(masked.any()) and (ours[masked] < -9e5).all() and (theirs[masked] < -9e5).all()
        real = real[..., None].expand_as(ours) & ~masked
    assert_parity(ours, theirs, what, real)


def _ours(head: str, seed: int = 5) -> LanguageModel:
    torch.manual_seed(1)
    model = LanguageModel(family_config(
        "big_bird", **SHAPE, block_sparse={"block_size": BLOCK, "num_random_blocks": RANDOM}))
    add_task_head(model, head, 3 if head == "token-classification" else None)
    return perturb(model, seed=seed)


@pytest.fixture(scope="module")
def theirs_folders(tmp_path_factory):
    """Each class (random weights moved off init) saved once by transformers."""
    root = tmp_path_factory.mktemp("bigbird-heads")
    torch.manual_seed(0)
    config = transformers.BigBirdConfig(**SHAPE, block_size=BLOCK, num_random_blocks=RANDOM,
                                        attention_type="block_sparse", num_labels=3)
    for head, name in HEADS.items():
        perturb(getattr(transformers, name)(config), scale=0.2).save_pretrained(root / head)
    return root


@pytest.mark.numerics
@pytest.mark.parametrize("head", list(HEADS))
def test_reads_transformers_folders(theirs_folders, head):
    theirs = getattr(transformers, HEADS[head]).from_pretrained(theirs_folders / head).eval()
    ours = lmlab.from_pretrained(theirs_folders / head)
    assert list(ours.heads) == [head] and not ours.fresh_heads
    assert (ours.pooler is not None) == (head == "token-classification")
    for length in LENGTHS:
        for types in (True, False):
            batch = _batch(length, types)
            with torch.no_grad():
                got = task_logits(ours, head, batch)
                forward = ours(**batch).logits
            _compare(got, _theirs(theirs, batch, head), batch, head, f"{head} {length} {types}")
            assert torch.equal(got, forward)  # exact: the same ops through forward


@pytest.mark.numerics
@pytest.mark.parametrize("head", list(HEADS))
def test_saves_what_transformers_reads(tmp_path, head):
    ours = _ours(head)
    assert (ours.pooler is not None) == (head == "token-classification")
    lmlab.save_pretrained(ours, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == [HEADS[head]] and saved["attention_type"] == "block_sparse"
    theirs, info = getattr(transformers, HEADS[head]).from_pretrained(
        tmp_path, output_loading_info=True)
    assert not any(info.values()), info  # nothing missing, unexpected or left random
    for length in LENGTHS:
        batch = _batch(length)
        with torch.no_grad():
            got = task_logits(ours, head, batch)
        _compare(got, _theirs(theirs.eval(), batch, head), batch, head, f"{head} at {length}")


@pytest.mark.numerics
def test_question_lengths_and_loss(theirs_folders):
    """Given question lengths (rather than the separator) mask and type as transformers'
    question_lengths do; the QA loss on start and end labels equals transformers' loss."""
    theirs = transformers.BigBirdForQuestionAnswering.from_pretrained(
        theirs_folders / "question-answering").eval()
    ours = lmlab.from_pretrained(theirs_folders / "question-answering")
    batch = {**_batch(50, types=False), "question_lengths": torch.tensor([[3], [12]])}
    with torch.no_grad():
        got = task_logits(ours, "question-answering", batch)
    _compare(got, _theirs(theirs, batch, "question-answering"), batch, "question-answering",
             "question_lengths")
    # unpadded rows: transformers' loss counts padding positions as candidates, whose logits
    # lmlab does not compute (it skips the padding)
    batch = {**_batch(50), "attention_mask": torch.ones(2, 50, dtype=torch.long)}
    starts, ends = torch.tensor([20, 15]), torch.tensor([24, 60])  # 60: outside, ignored
    with torch.no_grad():
        loss = ours(**batch, labels=torch.stack([starts, ends], -1)).loss
        theirs.bert.set_attention_type("block_sparse")
        want = theirs(**batch, start_positions=starts, end_positions=ends).loss
    assert_parity(loss, want, "QA loss")


_RELOAD = """
import sys, torch, lmlab
from lmlab.models.task_heads import task_logits
model = lmlab.from_pretrained(sys.argv[1])
batch = torch.load(sys.argv[2])
with torch.no_grad():
    torch.save(task_logits(model, "question-answering", batch), sys.argv[3])
"""


@pytest.mark.numerics
def test_saved_model_loads_in_a_fresh_process(tmp_path):
    ours = _ours("question-answering")
    lmlab.save_pretrained(ours, tmp_path / "model")
    batch = _batch(50)
    torch.save(batch, tmp_path / "batch.pt")
    subprocess.run([sys.executable, "-c", _RELOAD, tmp_path / "model", tmp_path / "batch.pt",
                    tmp_path / "out.pt"], check=True, timeout=120)
    with torch.no_grad():
        # exact: the same weights and ops on the same inputs in another process
        assert torch.equal(torch.load(tmp_path / "out.pt"),
                           task_logits(ours, "question-answering", batch))


@pytest.mark.slow  # ~10 s of export; the question mask itself is tested above
def test_onnx_export_leaves_the_question_out(tmp_path):
    """The exported QA graph finds the question by the separator as the model does."""
    pytest.importorskip("onnxruntime")
    from lmlab.export.onnx import OnnxModel, export_onnx

    ours = _ours("question-answering")
    export_onnx(ours, tmp_path / "onnx")
    batch = _batch(30)  # the dense fallback: an exported graph takes one attention path
    got = OnnxModel(tmp_path / "onnx").run(**{k: v.numpy() for k, v in batch.items()})
    with torch.no_grad():
        want = task_logits(ours, "question-answering", batch)
    _compare(torch.from_numpy(got), want, batch, "question-answering", "onnx")
