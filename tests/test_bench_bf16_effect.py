"""bench/bench_bf16_effect.py: the fp32 figure is the objective's mean validation loss, and
the bf16 figure is the same computation under autocast (close, not identical)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from test_bench_time_to_quality import SPECIAL, VOCAB, _source

from lmlab.data.pretraining import PretrainingStream
from lmlab.models.model import LanguageModel
from lmlab.models.presets import preset
from lmlab.objectives import build_objective

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("bench_bf16_effect",
                                              ROOT / "bench" / "bench_bf16_effect.py")
BENCH = importlib.util.module_from_spec(spec)
spec.loader.exec_module(BENCH)


def test_validation_loss_in_fp32_and_bf16():
    objective = build_objective("mlm", SPECIAL)
    torch.manual_seed(0)
    model = LanguageModel(preset("bert", "tiny", vocab_size=VOCAB, pad_token_id=0), heads=())
    objective.prepare(model)
    stream = iter(PretrainingStream(_source(), objective=objective, batch_size=4, seq_len=16,
                                    seed=3))
    batches = [next(stream) for _ in range(3)]
    fp32 = BENCH.validation_loss(model, objective, batches, "fp32")
    with torch.no_grad():
        expected = sum(float(objective.compute_loss(model, b).loss) for b in batches) / 3
    assert fp32 == expected  # the same losses, summed in the same order
    bf16 = BENCH.validation_loss(model, objective, batches, "bf16")
    # bfloat16 keeps 8 bits (eps 2**-7 = 0.8%) of each matrix product's inputs and sums in
    # float32, so the loss moves by about eps of itself; 2% is 2.5 eps, native or emulated bf16.
    assert bf16 == pytest.approx(fp32, rel=0.02) and bf16 != fp32  # tol: 2.5 bf16 eps (above)
