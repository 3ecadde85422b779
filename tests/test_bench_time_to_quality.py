"""The time-to-quality benchmark's pieces: both sides see the same windows, the reference is
scored the way our Trainer scores, its optimizer splits decay like ours, and the curve
arithmetic."""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_close_rounding

from lmlab.data.pretraining import InMemoryTokenSource, PretrainingStream
from lmlab.objectives import SpecialTokens, build_objective

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location(
        "bench_time_to_quality", ROOT / "bench" / "bench_time_to_quality.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BENCH = _bench()
VOCAB = 200
SPECIAL = SpecialTokens(vocab_size=VOCAB, pad_id=0, cls_id=2, sep_id=3, mask_id=4,
                        special_ids=(1,))


def _source(seed: int = 0) -> InMemoryTokenSource:
    rng = np.random.default_rng(seed)
    documents = []
    for _ in range(12):
        sentences = []
        for _ in range(int(rng.integers(2, 5))):
            ids = rng.integers(5, VOCAB, size=int(rng.integers(4, 15)))
            sentences.append((ids.tolist(), [True] * len(ids)))
        documents.append(sentences)
    return InMemoryTokenSource.from_sentences(documents, VOCAB)


class _Tok:
    """What reference_config reads of a tokenizer: its length and pad id."""

    pad_token_id = 0

    def __len__(self) -> int:
        return VOCAB


def test_reference_windows_are_our_training_windows():
    source = _source()
    ours = PretrainingStream(source, objective=build_objective("mlm", SPECIAL), batch_size=4,
                             seq_len=16, seed=7)
    clean = PretrainingStream(source, objective=BENCH.PassThrough(SPECIAL), batch_size=4,
                              seq_len=16, seed=7)
    checked = 0
    for masked, raw in zip(ours, clean):
        labels = masked["labels"]
        restored = torch.where(labels != -100, labels, masked["input_ids"])  # undo the masking
        assert torch.equal(restored, raw["input_ids"])
        assert torch.equal(masked["attention_mask"], raw["attention_mask"])
        assert "labels" not in raw
        checked += 1
        if checked == 6:  # crosses into a second epoch (reshuffled) on this small source
            break
    assert checked == 6


def test_time_to_reach_interpolates_and_reports_misses():
    curve = [[0.0, 9.0], [10.0, 7.0], [20.0, 5.0]]
    assert BENCH.time_to_reach(curve, 6.0) == pytest.approx(15.0)
    assert BENCH.time_to_reach(curve, 7.0) == pytest.approx(10.0)
    assert BENCH.time_to_reach(curve, 9.5) == 0.0
    assert BENCH.time_to_reach(curve, 4.9) is None


def test_reference_model_and_decay_split_match_ours():
    from transformers import BertForMaskedLM

    from lmlab.models.model import LanguageModel
    from lmlab.models.presets import preset
    from lmlab.training.optim import param_groups

    args = argparse.Namespace(size="tiny", lr=1e-3, weight_decay=0.01)
    reference = BertForMaskedLM(BENCH.reference_config(args, _Tok()))
    ours = LanguageModel(preset("bert", "tiny", vocab_size=VOCAB, pad_token_id=0), heads=())
    build_objective("mlm", SPECIAL).prepare(ours)

    def sizes(groups):
        return sorted(sum(p.numel() for p in g["params"]) for g in groups)

    theirs = BENCH.reference_optimizer(reference, args).param_groups
    assert [g["weight_decay"] for g in theirs] == [0.01, 0.0]
    assert sizes(theirs) == sizes(param_groups([ours], 0.01))
    assert reference.config._attn_implementation == "sdpa"


@pytest.mark.numerics
def test_reference_eval_is_the_mean_over_masked_positions():
    from transformers import BertForMaskedLM

    args = argparse.Namespace(size="tiny")
    torch.manual_seed(0)
    model = BertForMaskedLM(BENCH.reference_config(args, _Tok())).train()
    g = torch.Generator().manual_seed(1)
    batches = []
    for every in (3, 2):  # 3 and 5 masked positions per row: the batches weigh differently
        ids = torch.randint(5, VOCAB, (3, 10), generator=g)
        labels = torch.full_like(ids, -100)
        labels[:, 2::every] = ids[:, 2::every]
        batches.append({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                        "token_type_ids": torch.zeros_like(ids), "labels": labels})
    got = BENCH.reference_eval(model, batches)
    assert model.training  # put back into training mode
    model.eval()
    with torch.no_grad():
        logits = torch.cat([model(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
                            .logits.reshape(-1, VOCAB) for b in batches])
        labels = torch.cat([b["labels"].reshape(-1) for b in batches])
        expected = float(torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100))
    # the same logits, reduced per batch then weighted vs at once: log-sum-exp over VOCAB
    assert_close_rounding(got, expected, terms=VOCAB, depth=2, scale=expected)


def test_reference_features_mask_only_text_tokens_of_the_given_windows():
    from transformers import AutoTokenizer, DataCollatorForLanguageModeling

    from lmlab.utils.catalog import minilm_dir

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_dir()))
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, seed=0)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 20000, (4, 12), generator=g)
    ids[:, 0], ids[:, -1] = tokenizer.cls_token_id, tokenizer.sep_token_id
    mask = torch.ones_like(ids)
    ids[3, 8:], mask[3, 8:] = tokenizer.pad_token_id, 0  # a short last window, padded
    ids[3, 7] = tokenizer.sep_token_id
    features = BENCH.reference_features(
        {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)},
        collator)
    assert features["input_ids"].shape == ids.shape
    assert torch.equal(features["attention_mask"], mask)
    labels = features["labels"]
    predicted = labels != -100
    assert predicted.any()
    assert torch.equal(labels[predicted], ids[predicted])  # targets are the clean ids
    special = torch.isin(ids, torch.tensor(tokenizer.all_special_ids)) | (mask == 0)
    assert not (predicted & special).any()
    unchanged = ~predicted
    assert torch.equal(features["input_ids"][unchanged], ids[unchanged])


@pytest.mark.slow
def test_end_to_end_on_the_demo_shards(tmp_path):
    matches = glob.glob(str(ROOT / BENCH.DEFAULT_SHARDS))
    if not matches:
        pytest.skip("no demo shards (run `make demo` first)")
    out = tmp_path / "ttq"
    code = BENCH.main(["--shards", matches[0], "--budget", "3s", "--threads", "1",
                       "--eval-every-seconds", "1", "--eval-batches", "1", "--out", str(out)])
    assert code == 0
    result = json.loads((out / "time_to_quality.json").read_text())
    for side in ("ours", "reference"):
        curve = result[side]["curve"]
        assert len(curve) >= 2 and curve[0][0] == 0.0
        assert all(math.isfinite(loss) for _, loss in curve)
        assert result[side]["tokens"] > 0
    assert result["ours"]["curve"][0][1] == pytest.approx(result["reference"]["curve"][0][1],
                                                          abs=0.5)  # tol: two random inits; both start near ln(V)
    assert (out / "time_to_quality.png").stat().st_size > 1000


def _masking_collator(rows):
    """A stand-in for DataCollatorForLanguageModeling: pads, predicts every third token."""
    length = max(len(r["input_ids"]) for r in rows)
    ids = torch.zeros(len(rows), length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, :len(row["input_ids"])] = torch.tensor(row["input_ids"])
        mask[i, :len(row["input_ids"])] = 1
    labels = torch.full_like(ids, -100)
    labels[:, 1::3] = torch.where(mask[:, 1::3] == 1, ids[:, 1::3], -100)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids),
            "labels": labels}


@pytest.mark.parametrize("budget, steps, reason", [(1e9, 3, "planned_steps"),
                                                    (0.0, 1, "budget")])
def test_trainer_reference_stops_at_the_plan_or_the_budget(budget, steps, reason):
    pytest.importorskip("accelerate")
    from transformers import BertForMaskedLM

    source = _source()
    args = argparse.Namespace(size="tiny", lr=1e-3, weight_decay=0.01, clip_norm=1.0, seed=0,
                              batch_size=4, budget_seconds=budget, eval_every_seconds=1e9)
    torch.manual_seed(0)
    model = BertForMaskedLM(BENCH.reference_config(args, _Tok())).train()
    before = model.bert.embeddings.word_embeddings.weight.detach().clone()

    def windows():
        return iter(PretrainingStream(source, objective=BENCH.PassThrough(SPECIAL),
                                      batch_size=4, seq_len=16, seed=0))

    val = [_masking_collator([{"input_ids": list(range(5, 15))}] * 2)]
    result = BENCH.run_reference_trainer(args, model, windows, _masking_collator, val,
                                         planned=3, warmup=0)
    assert result["loop"] == "transformers.Trainer"
    assert result["steps"] == steps and result["stop_reason"] == reason
    assert len(result["curve"]) == 2 and result["curve"][0][0] == 0.0  # start and end
    assert all(math.isfinite(loss) for _, loss in result["curve"])
    assert result["tokens"] >= steps * 4 * 8  # every trained row was counted
    assert not torch.equal(before, model.bert.embeddings.word_embeddings.weight)
