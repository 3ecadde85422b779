"""XLNet's permutation LM (``plm``): its masks against transformers'
DataCollatorForPermutationLanguageModeling on the same KJV windows over many draws (share
predicted, span lengths, perm_mask / target_mapping invariants); the loss is the LM head's
on the query stream; pretraining through ``lmlab pretrain`` and fine-tuning through
``lmlab finetune``."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
from conftest import finetune_kinds, run_lmlab

transformers = pytest.importorskip("transformers")

from lmlab.objectives.masking import IGNORE_INDEX  # noqa: E402
from lmlab.objectives.registry import build_objective  # noqa: E402
from lmlab.objectives.special_tokens import SpecialTokens  # noqa: E402
from lmlab.utils.catalog import minilm_dir  # noqa: E402

LENGTH, ROWS = 64, 16


@pytest.fixture(scope="module")
def windows():
    """(ids (ROWS, LENGTH) of [CLS] KJV text [SEP], padded rows included; the tokenizers)."""
    from lmlab.text.sources.kjv import KJVSource
    from lmlab.tokenization.tokenizer import Tokenizer

    if minilm_dir() is None:
        pytest.skip("MiniLM tokenizer not available")
    theirs = transformers.AutoTokenizer.from_pretrained(minilm_dir())
    text = [" ".join(d.sentences) for d in itertools.islice(KJVSource().iter_documents(), ROWS)]
    ids = theirs(text, max_length=LENGTH, truncation=True, padding="max_length",
                 return_tensors="pt")["input_ids"]
    ids[3, 40:] = theirs.pad_token_id  # short rows: padding is never predicted
    ids[3, 39] = theirs.sep_token_id
    return ids, theirs, Tokenizer.from_pretrained(minilm_dir())


def run_lengths(predicted: np.ndarray) -> list[int]:
    """Lengths of the runs of predicted positions in each row."""
    runs = []
    for row in predicted:
        edges = np.flatnonzero(np.diff(np.concatenate([[0], row.astype(int), [0]])))
        runs += list(edges[1::2] - edges[::2])
    return runs


def check_invariants(perm: torch.Tensor, predicted: torch.Tensor, plain: torch.Tensor) -> None:
    """perm_mask of one row (T, T), its predicted positions and its plain (real, not special)
    tokens: no one is kept from a token that is not predicted; a predicted token cannot see
    itself; plain tokens see no predicted one; the predicted tokens see each other in one
    strict order (ranks 0..n-1)."""
    blocked = perm.bool()
    assert not blocked[:, ~predicted].any()
    assert blocked[predicted][:, predicted].diagonal().all()
    assert blocked[plain & ~predicted][:, predicted].all()
    among = blocked[predicted][:, predicted]
    seen = (~among).sum(1)  # how many predicted tokens each one sees
    assert sorted(seen.tolist()) == list(range(int(predicted.sum())))


def test_masks_match_the_transformers_collator(windows):
    ids, theirs, ours_tokenizer = windows
    collator = transformers.DataCollatorForPermutationLanguageModeling(
        theirs, plm_probability=1 / 6, max_span_length=5)
    objective = build_objective("plm", SpecialTokens.from_tokenizer(ours_tokenizer))
    special = torch.tensor(theirs.get_special_tokens_mask(ids[0].tolist(),
                                                          already_has_special_tokens=True))
    assert special[0] == 1
    plain = ~torch.isin(ids, torch.tensor(theirs.all_special_ids))
    stats = {"ours": ([], []), "theirs": ([], [])}
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    for _ in range(25):
        _, perm, mapping, labels = collator.torch_mask_tokens(ids.clone())
        predicted = labels != IGNORE_INDEX
        stats["theirs"][0].append(float(predicted[plain].float().mean()))
        stats["theirs"][1].extend(run_lengths(predicted.numpy()))
        # exact: 0/1 values written, compared as written
        assert torch.equal(mapping, torch.eye(LENGTH).expand_as(mapping))  # one row per token
        for row in range(0, ROWS, 5):
            check_invariants(perm[row], predicted[row], plain[row])

        batch = objective.corrupt({"input_ids": ids, "attention_mask": (ids != 0).long()},
                                  generator)
        assert torch.equal(batch["input_ids"], ids)  # the content stream keeps every token
        real = batch["labels"] != IGNORE_INDEX  # (B, M)
        predicted = batch["target_mapping"][real.nonzero(as_tuple=True)]  # (N, T) one-hot rows
        assert torch.equal(predicted.sum(1), torch.ones(len(predicted)))  # exact: sums of 0/1
        mask = torch.zeros_like(ids, dtype=torch.bool)
        rows, positions = real.nonzero(as_tuple=True)[0], predicted.argmax(1)
        mask[rows, positions] = True
        assert torch.equal(ids[rows, positions], batch["labels"][real])
        assert not batch["target_mapping"][~real].any()
        assert not (mask & ~plain).any()
        stats["ours"][0].append(float(mask[plain].float().mean()))
        stats["ours"][1].extend(run_lengths(mask.numpy()))
        for row in range(0, ROWS, 5):
            check_invariants(batch["perm_mask"][row], mask[row], plain[row])
    share = {k: np.mean(v[0]) for k, v in stats.items()}
    assert abs(share["ours"] - share["theirs"]) < 0.01, share  # tol: 400 rows of ~55 tokens
    assert 0.13 < share["ours"] < 0.19, share  # tol: about 1/6, less where spans pass the end
    hist = {k: np.bincount(np.minimum(v[1], 8), minlength=9)[1:] / len(v[1])
            for k, v in stats.items()}
    assert np.abs(hist["ours"] - hist["theirs"]).sum() / 2 < 0.06, hist  # tol: total variation


def test_loss_is_the_lm_head_on_the_query_stream(windows):
    """plm's loss equals cross-entropy of XLNetLMHeadModel's logits with its inputs, on a
    transformers folder written from our model (the same perm_mask, target_mapping)."""
    import tempfile

    import lmlab
    from lmlab.models.presets import preset
    from lmlab.models.xlnet import XLNetModel

    ids, _, ours_tokenizer = windows
    objective = build_objective("plm", SpecialTokens.from_tokenizer(ours_tokenizer))
    torch.manual_seed(0)
    model = XLNetModel(preset("xlnet", "tiny", vocab_size=ours_tokenizer.vocab_size,
                              hidden_size=32, num_attention_heads=4, intermediate_size=64))
    objective.prepare(model)
    model.eval()
    batch = objective.corrupt({"input_ids": ids[:4], "attention_mask": (ids[:4] != 0).long()},
                              torch.Generator().manual_seed(1))
    result = objective.compute_loss(model, batch)
    with tempfile.TemporaryDirectory() as folder:
        lmlab.save_pretrained(model, folder)
        theirs = transformers.XLNetLMHeadModel.from_pretrained(folder).eval()
    with torch.no_grad():
        ref = theirs(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                     perm_mask=batch["perm_mask"], target_mapping=batch["target_mapping"],
                     labels=batch["labels"], use_mems=False).loss
    assert result.num_predictions == int((batch["labels"] != IGNORE_INDEX).sum())
    assert abs(float(result.loss.detach()) - float(ref)) < 1e-5  # tol: float32 rounding of a mean CE


def pretrain(shards, out, steps: int, seq_len: int):
    return run_lmlab("pretrain", "--family", "xlnet", "--size", "tiny", "--objective", "plm",
                     "--shards", shards, "--out", out, "--seq-len", seq_len, "--batch-size", 8,
                     "--lr", 3e-3, "--steps", steps, "--log-every", 10,
                     "--eval-every", steps, "--seed", 0, "--threads", 1)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    from conftest import unigram_kjv_shards

    return unigram_kjv_shards(tmp_path_factory, "xlnet-corpus")


def train_losses(out) -> list[float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    return [r["loss"] for r in rows if r["kind"] == "train"]


def test_pretrain_and_finetune(shards, tmp_path):
    """A few dozen plm steps: the loss falls, cost.md is written, transformers reads the model;
    then lmlab finetune trains XLNet's summary head on it (XLNetForSequenceClassification)."""
    out = tmp_path / "run"
    result = pretrain(shards, out, 40, 64)
    assert result.returncode == 0, result.stderr[-2000:]
    losses = train_losses(out)
    assert np.mean(losses[-3:]) < losses[0] - 0.8, losses
    assert (out / "cost.md").is_file()
    assert json.loads((out / "model" / "config.json").read_text())["architectures"] == [
        "XLNetLMHeadModel"]
    transformers.XLNetLMHeadModel.from_pretrained(out / "model")

    saved = finetune_kinds(out, tmp_path / "tuned", epochs=3, lr=1e-3, fall=1.0)
    assert saved["architectures"] == ["XLNetForSequenceClassification"]
    transformers.XLNetForSequenceClassification.from_pretrained(tmp_path / "tuned" / "model")


@pytest.mark.slow
def test_pretrain_a_few_hundred_steps(shards, tmp_path):
    out = tmp_path / "run"
    result = pretrain(shards, out, 300, 128)
    assert result.returncode == 0, result.stderr[-2000:]
    losses = train_losses(out)
    assert np.mean(losses[-5:]) < losses[0] - 1.0, losses
    assert (out / "cost.md").is_file()
