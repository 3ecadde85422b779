"""XLNet's question answering against transformers 5.23 on random weights moved off their
initialisation: the span head (XLNetForQuestionAnsweringSimple) and the beam head
(XLNetForQuestionAnswering: the top starts, the top ends of each, the answerability logit; its
loss with start and end positions, cls_index and is_impossible), both ways, on batches padded on
the left (XLNetTokenizer's side) and on the right; a fresh process reads the saved folder."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import assert_parity, perturb

import lmlab
from lmlab.models.presets import preset
from lmlab.models.task_heads import task_logits
from lmlab.models.xlnet import XLNetModel
from lmlab.utils.errors import LmlabError

transformers = pytest.importorskip("transformers")

VOCAB, LENGTH, LENGTHS = 97, 12, (12, 9, 7, 10)
SHAPE = dict(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, intermediate_size=64)
BEAM = "question-answering-beam"
FIELDS = ("start_top_log_probs", "start_top_index", "end_top_log_probs", "end_top_index",
          "cls_logits")


def _ours(head: str) -> XLNetModel:
    torch.manual_seed(0)
    config = preset("xlnet", "tiny", **SHAPE)
    config.extra.update(start_n_top=3, end_n_top=2)
    return perturb(XLNetModel(config, heads=[head]))


def _batches():
    """The same rows padded on the left (ids, mask, segments) and on the right."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(6, VOCAB, (4, LENGTH), generator=generator)
    segments = torch.zeros_like(ids)
    segments[:, 5:] = 1
    left, right = torch.zeros(4, LENGTH, dtype=torch.long), torch.zeros(4, LENGTH, dtype=torch.long)
    right_ids, right_segments = torch.full_like(ids, 5), torch.zeros_like(ids)
    for row, n in enumerate(LENGTHS):
        left[row, LENGTH - n:] = 1
        right[row, :n] = 1
        right_ids[row, :n], right_segments[row, :n] = ids[row, -n:], segments[row, -n:]
    return (dict(input_ids=ids, attention_mask=left, token_type_ids=segments),
            dict(input_ids=right_ids, attention_mask=right, token_type_ids=right_segments))


def _beam(model, batch: dict, **inputs) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        out = model(**batch, **inputs, heads=[BEAM], use_mems=False).logits
    return out._asdict()


def _theirs_beam(model, batch: dict, p_mask=None, **inputs) -> dict[str, torch.Tensor]:
    """transformers' outputs, padding in p_mask as lmlab always has it."""
    pad = 1.0 - batch["attention_mask"].float()
    p_mask = pad if p_mask is None else torch.maximum(p_mask, pad)
    with torch.no_grad():
        out = model(**batch, p_mask=p_mask, **inputs, use_mems=False)
    return {name: getattr(out, name) for name in FIELDS}


def _check_beam(got: dict, want: dict, what: str, shift: torch.Tensor | None = None) -> None:
    """Probabilities and logits within rounding, indices equal (``shift``: each row's padding
    on the left of ``want``'s rows, which moves its positions)."""
    for name in FIELDS:
        if name.endswith("index"):
            moved = want[name] - (0 if shift is None else shift[:, None])
            assert torch.equal(got[name], moved), (what, name)
        else:
            assert_parity(got[name], want[name], f"{what} {name}")


@pytest.mark.numerics
def test_span_head_both_ways(tmp_path):
    """XLNetForQuestionAnsweringSimple: start and end logits on the real tokens."""
    ours = _ours("question-answering")
    lmlab.save_pretrained(ours, tmp_path / "ours")
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["architectures"] == ["XLNetForQuestionAnsweringSimple"]
    theirs, info = transformers.XLNetForQuestionAnsweringSimple.from_pretrained(
        tmp_path / "ours", output_loading_info=True)
    assert not any(info.values()), info
    left, right = _batches()
    with torch.no_grad():
        out = theirs.eval()(**left, use_mems=False)
        want = torch.stack([out.start_logits, out.end_logits], -1)
        assert_parity(task_logits(ours, "question-answering", left), want, "span",
                      left["attention_mask"].bool())
        got = task_logits(ours, "question-answering", right)
    for row, n in enumerate(LENGTHS):
        assert_parity(got[row, :n], want[row, LENGTH - n:], "span right-padded")
    perturb(theirs, seed=7).save_pretrained(tmp_path / "theirs")
    back = lmlab.from_pretrained(tmp_path / "theirs")
    assert list(back.heads) == ["question-answering"] and not back.fresh_heads
    with torch.no_grad():
        out = theirs(**left, use_mems=False)
        assert_parity(task_logits(back, "question-answering", left),
                      torch.stack([out.start_logits, out.end_logits], -1), "span read back",
                      left["attention_mask"].bool())


@pytest.mark.numerics
def test_beam_head_both_ways(tmp_path):
    """XLNetForQuestionAnswering's five inference outputs, with its n_top settings, padding on
    either side, a p_mask and a cls_index given; then transformers' model read by lmlab."""
    ours = _ours(BEAM)
    lmlab.save_pretrained(ours, tmp_path / "ours")
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["architectures"] == ["XLNetForQuestionAnswering"]
    assert (saved["start_n_top"], saved["end_n_top"]) == (3, 2)
    theirs, info = transformers.XLNetForQuestionAnswering.from_pretrained(
        tmp_path / "ours", output_loading_info=True)
    assert not any(info.values()), info
    theirs.eval()
    left, right = _batches()
    want = _theirs_beam(theirs, left)
    assert want["start_top_index"].shape == (4, 3) and want["end_top_index"].shape == (4, 6)
    _check_beam(_beam(ours, left), want, "left-padded")
    shift = LENGTH - torch.tensor(LENGTHS)  # the answerability reads each row's last real token
    _check_beam(_beam(ours, right), want, "right-padded", shift)
    question = torch.zeros(4, LENGTH)
    question[:, :7] = 1  # never an answer: the question, on the left
    cls_index = torch.tensor([11, 5, 8, 3])
    _check_beam(_beam(ours, left, p_mask=question, cls_index=cls_index),
                _theirs_beam(theirs, left, question, cls_index=cls_index), "p_mask, cls_index")

    perturb(theirs, seed=7).save_pretrained(tmp_path / "theirs")
    back = lmlab.from_pretrained(tmp_path / "theirs")
    assert list(back.heads) == [BEAM] and not back.fresh_heads
    assert (back.config.extra["start_n_top"], back.config.extra["end_n_top"]) == (3, 2)
    _check_beam(_beam(back, left), _theirs_beam(theirs, left), "read back")


@pytest.mark.numerics
def test_beam_loss_equals_transformers(tmp_path):
    """Start and end cross-entropies (ends given the labelled start), plus half the
    answerability's binary cross-entropy when is_impossible is given; padded rows."""
    ours = _ours(BEAM)
    lmlab.save_pretrained(ours, tmp_path)
    theirs = transformers.XLNetForQuestionAnswering.from_pretrained(tmp_path).eval()
    left, _ = _batches()
    starts, ends = torch.tensor([4, 6, 9, 3]), torch.tensor([6, 8, 11, 7])
    cls_index, impossible = torch.tensor([11, 10, 11, 9]), torch.tensor([0.0, 1.0, 0.0, 1.0])
    pad = 1.0 - left["attention_mask"].float()  # lmlab's p_mask always holds the padding
    with torch.no_grad():
        for labels, extra in ((torch.stack([starts, ends], -1), {}),
                              (torch.stack([starts, ends, impossible.long()], -1),
                               dict(cls_index=cls_index, is_impossible=impossible))):
            got = ours(**left, labels=labels, heads=[BEAM], use_mems=False,
                       cls_index=extra.get("cls_index")).loss
            want = theirs(**left, start_positions=starts, end_positions=ends, p_mask=pad,
                          use_mems=False, **extra).loss
            assert_parity(got, want, f"loss with {labels.shape[1]} columns")


def test_beam_refusals():
    ours = _ours(BEAM)
    hidden = torch.randn(2, 5, 32)
    with pytest.raises(LmlabError, match="beam QA labels have shape"):
        ours.heads[BEAM].loss(hidden, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(LmlabError, match="keeps 3 starts and 2 ends of 2 tokens"):
        ours.heads[BEAM](hidden[:, :2])


_RELOAD = """
import sys, torch, lmlab
model = lmlab.from_pretrained(sys.argv[1])
batch = torch.load(sys.argv[2])
with torch.no_grad():
    torch.save(model(**batch, use_mems=False).logits._asdict(), sys.argv[3])
"""


@pytest.mark.numerics
def test_beam_model_loads_in_a_fresh_process(tmp_path):
    ours = _ours(BEAM)
    lmlab.save_pretrained(ours, tmp_path / "model")
    left, _ = _batches()
    torch.save(left, tmp_path / "batch.pt")
    subprocess.run([sys.executable, "-c", _RELOAD, tmp_path / "model", tmp_path / "batch.pt",
                    tmp_path / "out.pt"], check=True, timeout=120)
    got, want = torch.load(tmp_path / "out.pt"), _beam(ours, left)
    for name in FIELDS:
        assert torch.equal(got[name], want[name]), name  # exact: the same ops, another process
