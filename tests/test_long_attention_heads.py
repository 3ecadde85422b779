"""Task heads of the windowed families, parity both ways with transformers 5.23 on random,
perturbed weights and padded batches: GPT-Neo's sequence classification (the last real token,
a bias-free ``score``), token classification and QA; Longformer's four heads with the global
tokens its classes set when given none ([CLS]; the question before the first separator; the
tokens after the first two), and an explicit ``global_attention_mask``; ``lmlab finetune``."""

from __future__ import annotations

import shutil

import pytest
import torch
from conftest import assert_parity, finetune_kinds, perturb

import lmlab
from lmlab.models.model import LanguageModel
from lmlab.models.presets import family_config
from lmlab.models.task_heads import add_task_head, default_global_tokens, task_logits
from lmlab.utils.errors import LmlabError

transformers = pytest.importorskip("transformers")

VOCAB, HIDDEN = 97, 32
HF_CLASSES = {"sequence-classification": "ForSequenceClassification",
              "token-classification": "ForTokenClassification",
              "question-answering": "ForQuestionAnswering",
              "multiple-choice": "ForMultipleChoice"}
NEO_HEADS = ("sequence-classification", "token-classification", "question-answering")
LONGFORMER_HEADS = tuple(HF_CLASSES)


def _config(family: str):
    shape = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=64, max_position_embeddings=64)
    if family == "gpt_neo":  # a padding id, as transformers needs to batch its classifier
        return family_config("gpt_neo", attention_window=[0, 4], pad_token_id=0, **shape)
    return family_config("longformer", attention_window=[4, 6], **shape)


def _batch(family: str, head: str) -> dict[str, torch.Tensor]:
    """Right-padded ids longer than the windows: (2, 19), (2, 3, 19) for multiple choice. Each
    Longformer sequence reads <s> q </s></s> c </s> (three separators, id 2) so its classes can
    find the question; GPT-Neo's rows pad with id 0, which no real token has."""
    shape = (2, 3, 19) if head == "multiple-choice" else (2, 19)
    ids = torch.randint(3, VOCAB, shape, generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(ids)
    mask[1, ..., 13:] = 0
    if family == "gpt_neo":
        return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}
    ids[..., 0] = 0
    ids[..., 5:7] = 2
    ids[0, ..., 18] = ids[1, ..., 12] = 2
    return {"input_ids": ids.masked_fill(mask == 0, 1), "attention_mask": mask}


def _theirs_logits(model, batch: dict, head: str) -> torch.Tensor:
    with torch.no_grad():
        out = model(**batch)
    if head == "question-answering":
        return torch.stack([out.start_logits, out.end_logits], -1)
    return out.logits


def _check(ours: torch.Tensor, theirs: torch.Tensor, batch: dict, head: str, what: str) -> None:
    """Per-token heads compared on the real tokens (padding positions predict nothing)."""
    real = batch["attention_mask"].bool() if head in ("token-classification",
                                                      "question-answering") else None
    assert_parity(ours, theirs, what, real, terms=64, depth=4)


def _ours(family: str, head: str) -> LanguageModel:
    torch.manual_seed(0)
    model = LanguageModel(_config(family))
    add_task_head(model, head, None if head in ("question-answering", "multiple-choice") else 3)
    return perturb(model)


CASES = [("gpt_neo", head) for head in NEO_HEADS] + [("longformer", h) for h in LONGFORMER_HEADS]


@pytest.mark.numerics
@pytest.mark.parametrize("family,head", CASES)
def test_saved_heads_match_transformers(tmp_path, family, head):
    """lmlab -> transformers: the folder loads as the family's class (no tensor left random)
    with lmlab's logits."""
    ours = _ours(family, head)
    lmlab.save_pretrained(ours, tmp_path)
    prefix = "GPTNeo" if family == "gpt_neo" else "Longformer"
    cls = getattr(transformers, prefix + HF_CLASSES[head])
    theirs, info = cls.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"], info
    batch = _batch(family, head)
    with torch.no_grad():
        got = task_logits(ours, head, batch)
    _check(got, _theirs_logits(theirs.eval(), batch, head), batch, head, f"{family} {head}")


@pytest.mark.numerics
@pytest.mark.parametrize("family,head", CASES)
def test_transformers_heads_load_with_their_logits(tmp_path, family, head):
    """transformers -> lmlab: a random, perturbed transformers task model read by
    lmlab.from_pretrained gives its logits."""
    torch.manual_seed(1)
    if family == "gpt_neo":
        config = transformers.GPTNeoConfig(
            vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=2, num_heads=4,
            max_position_embeddings=64, attention_types=[[["local", "global"], 1]],
            window_size=5, pad_token_id=0, num_labels=3)
        cls = getattr(transformers, "GPTNeo" + HF_CLASSES[head])
    else:
        config = transformers.LongformerConfig(
            vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=48, max_position_embeddings=64, attention_window=[8, 4],
            pad_token_id=1, num_labels=2 if head == "question-answering" else 3)
        cls = getattr(transformers, "Longformer" + HF_CLASSES[head])
    perturb(cls(config)).save_pretrained(tmp_path)
    theirs = cls.from_pretrained(tmp_path).eval()
    ours = lmlab.from_pretrained(tmp_path)
    assert list(ours.heads) == [head] and not getattr(ours, "fresh_heads", [])
    batch = _batch(family, head)
    with torch.no_grad():
        got = task_logits(ours, head, batch)
    _check(got, _theirs_logits(theirs, batch, head), batch, head, f"{family} {head}")


@pytest.mark.numerics
def test_global_tokens_given_and_by_default(tmp_path):
    """An explicit global_attention_mask reaches the stack (token classification: none by
    default, as transformers'); the model's forward sets the same default global tokens as
    task_logits; the defaults are the positions transformers' classes choose."""
    model = _ours("longformer", "token-classification")
    lmlab.save_pretrained(model, tmp_path)
    theirs = transformers.LongformerForTokenClassification.from_pretrained(tmp_path).eval()
    batch = _batch("longformer", "token-classification")
    glob = torch.zeros_like(batch["input_ids"])
    glob[:, [0, 3]] = 1
    glob[1, 9] = 1
    given_batch = {**batch, "global_attention_mask": glob}
    with torch.no_grad():
        plain = task_logits(model, "token-classification", batch)
        given = task_logits(model, "token-classification", given_batch)
        forward = model(**given_batch).logits
    _check(given, _theirs_logits(theirs, given_batch, "token-classification"), batch,
           "token-classification", "given")
    assert torch.equal(given, forward)  # exact: one computation, the same call underneath
    assert (plain - given).abs().max() > 1e-3  # the global tokens change the logits

    seq = _ours("longformer", "sequence-classification")
    batch = _batch("longformer", "sequence-classification")
    with torch.no_grad():
        # exact: forward and task_logits run the same ops on the same default global tokens
        assert torch.equal(seq(**batch, heads=["sequence-classification"]).logits,
                           task_logits(seq, "sequence-classification", batch))
    config, ids = seq.config, batch["input_ids"]
    first = default_global_tokens(config, "sequence-classification", ids)
    question = default_global_tokens(config, "question-answering", ids)
    choices = default_global_tokens(config, "multiple-choice", ids)
    assert first[:, 0].eq(1).all() and first.sum() == 2
    assert question.tolist() == [[1] * 5 + [0] * 14] * 2  # <s> and the question
    assert choices.tolist() == [[0] * 7 + [1] * 12] * 2  # after </s></s>, padding masked later
    assert default_global_tokens(config, "token-classification", ids) is None
    with pytest.raises(LmlabError, match="exactly three"):
        default_global_tokens(config, "question-answering", ids[:, :10])


def test_last_token_reads_the_last_real_position():
    """GPT-Neo's classifier reads each row's rightmost unmasked token, left padding too."""
    model = _ours("gpt_neo", "sequence-classification")
    ids = torch.randint(1, VOCAB, (1, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        alone = model(input_ids=ids, heads=["sequence-classification"]).logits
        left = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], 1)
        mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones_like(ids)], 1)
        right = torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], 1)
        padded_right = model(input_ids=right, attention_mask=mask.flip(1),
                             heads=["sequence-classification"]).logits
        positions = (mask.cumsum(1) - 1).clamp(min=0)
        padded_left = model(input_ids=left, attention_mask=mask, position_ids=positions,
                            heads=["sequence-classification"]).logits
    assert_parity(padded_right, alone, "right padding", terms=64, depth=4)
    assert_parity(padded_left, alone, "left padding", terms=64, depth=4)
    assert "score.bias" not in str(list(model.heads["sequence-classification"].state_dict()))


@pytest.mark.parametrize("family", ["gpt_neo", "longformer"])
def test_finetune_through_the_cli(tiny_bert_folder, tmp_path, family):
    """`lmlab finetune` on a tiny folder of the family (MiniLM's WordPiece tokenizer beside it):
    the head trains (loss falls) and the run's model is the family's transformers class."""
    torch.manual_seed(0)
    shape = dict(vocab_size=30522, hidden_size=HIDDEN, num_hidden_layers=2,
                 num_attention_heads=4, intermediate_size=64, max_position_embeddings=130)
    windows = dict(attention_window=[0, 4]) if family == "gpt_neo" else dict(attention_window=4)
    folder = lmlab.save_pretrained(LanguageModel(family_config(family, **shape, **windows)),
                                   tmp_path / family)
    for name in tiny_bert_folder.iterdir():
        if name.name.startswith(("tokenizer", "vocab", "special_tokens")):
            shutil.copy(name, folder / name.name)
    saved = finetune_kinds(folder, tmp_path / "run", sentence="the {w} is here, look at it now",
                           train=16, dev=4, epochs=5)
    prefix = "GPTNeo" if family == "gpt_neo" else "Longformer"
    assert saved["architectures"] == [prefix + "ForSequenceClassification"]
    if family == "gpt_neo":  # the tokenizer's padding id, which transformers' classifier reads
        assert saved["pad_token_id"] == 0
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(
        tmp_path / "run" / "model").eval()
    ours = lmlab.from_pretrained(tmp_path / "run" / "model")
    batch = {"input_ids": torch.tensor([[101, 1996, 3899, 102, 0, 0], [101, 1996, 2387, 2003, 2182,
                                                                       102]]),
             "attention_mask": torch.tensor([[1, 1, 1, 1, 0, 0], [1] * 6])}
    with torch.no_grad():
        _check(task_logits(ours, "sequence-classification", batch), theirs(**batch).logits,
               batch, "sequence-classification", f"{family} fine-tuned")
