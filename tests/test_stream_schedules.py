"""The papers' schedules on the data stream: BERT's sequence-length schedule, GPT-3's batch-size
ramp and data-mixture weights over corpus sources; sampled as specified, resumed exactly (a run
resumed after the switch in a fresh process ends bit-identical to an uninterrupted one), and
every bad setting refused before any work."""

from __future__ import annotations

import collections
import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_clean_refusal, run_lmlab, run_lmlab_here

from lmlab.data.mixture import SourceMixture, parse_mix
from lmlab.data.phases import PhasedStream, ramped_batch_size
from lmlab.data.pretraining import PretrainingStream
from lmlab.data.shard_reader import ShardReader
from lmlab.objectives import SpecialTokens, build_objective
from lmlab.training.metrics_log import read_metrics
from lmlab.utils.errors import LmlabError

SOURCES = ("kjv", "fortunes", "jargon")


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """Token shards (MiniLM's WordPiece) of 20 training and 4 validation documents from each
    of three real sources: KJV chapters, fortunes and Jargon File entries."""
    from lmlab.data.shards import build_shards
    from lmlab.text.sources import get_source
    from lmlab.tokenization.tokenizer import Tokenizer
    from lmlab.utils.catalog import minilm_dir

    root = tmp_path_factory.mktemp("mixed")
    (root / "corpus").mkdir()
    for split, (lo, hi) in (("train", (0, 20)), ("validation", (20, 24))):
        with open(root / "corpus" / f"{split}.jsonl", "w", encoding="utf-8") as handle:
            for name in SOURCES:
                for document in itertools.islice(get_source(name).iter_documents(), lo, hi):
                    handle.write(document.to_json() + "\n")
    build_shards(Tokenizer.from_pretrained(minilm_dir()), root / "corpus", root / "shards",
                 shard_tokens=4096, show_progress=False)
    return root / "shards"


def _objective(shards: Path, spec: str = "mlm"):
    from lmlab.tokenization.tokenizer import Tokenizer
    from lmlab.utils.catalog import minilm_dir

    return build_objective(spec, SpecialTokens.from_tokenizer(
        Tokenizer.from_pretrained(minilm_dir())))


def test_shards_record_each_documents_source(shards):
    codes, names = ShardReader(shards, "train").document_sources()
    assert names == list(SOURCES)
    documents = [json.loads(line)["source"]
                 for line in (shards.parent / "corpus" / "train.jsonl").read_text().splitlines()]
    assert [names[c] for c in codes] == documents  # every document kept, in corpus order


@pytest.mark.parametrize("spec", ["mlm", "mlm,sop"])  # packed windows, segment pairs
def test_mix_samples_sources_as_specified(shards, spec):
    """Realised example counts per source against the weights: a chi-square test (a wrong
    sampler, e.g. the corpus's own 1:1:1 shares, fails it at these counts), a source left out
    never drawn."""
    from scipy.stats import chisquare

    weights = {"kjv": 0.6, "jargon": 0.4}
    stream = PretrainingStream(shards, objective=_objective(shards, spec), batch_size=32,
                               seq_len=64, seed=5, mix="kjv=0.6,jargon=0.4")
    mixture = stream.mixture
    unit_source = {int(u): name for name, pool in zip(mixture.names, mixture.pools) for u in pool}
    counts: collections.Counter = collections.Counter()
    for batch in itertools.islice(stream, 60):  # 1,920 examples
        for example_id in batch["example_id"].tolist():
            unit = example_id >> 20 if spec != "mlm" else example_id  # a pair's id: doc << 20
            counts[unit_source[unit]] += 1
    observed = [counts[name] for name in mixture.names]
    assert set(counts) == set(weights) and sum(observed) == 1920
    expected = [1920 * weights[name] for name in mixture.names]
    assert chisquare(observed, expected).pvalue > 1e-3, observed
    assert chisquare(observed, [960, 960]).pvalue < 1e-6  # and not an even split


def test_mixture_draws_match_weights_over_many_draws():
    mixture = SourceMixture(np.array([0] * 5 + [1] * 50 + [2] * 9), ["a", "b", "c"],
                            {"a": 0.5, "b": 0.2, "c": 0.3}, seed=1)
    draws = np.bincount([mixture.source_of(n) for n in range(20_000)], minlength=3)
    # tol: a sampling rate over 20,000 draws (binomial spread at most 0.0035)
    assert np.abs(draws / 20_000 - [0.5, 0.2, 0.3]).max() < 0.015
    # the small source repeats in new orders, each unit once per epoch of the source
    units = [mixture.unit(0, k)[0] for k in range(15)]
    assert sorted(units[:5]) == sorted(units[5:10]) == list(range(5)) and units[:5] != units[5:10]


def test_batch_ramp_sizes_and_resume(shards):
    # GPT-3's ramp by hand: 32 sequences of 64 = 2,048 tokens, from 256 tokens over 4,096
    assert [ramped_batch_size(t, 32, 64, 256, 4096) for t in (0, 1024, 2048, 4096, 10**6)] == [
        4, (256 + 1792 * 0.25) // 64, (256 + 1792 * 0.5) // 64, 32, 32]
    assert ramped_batch_size(0, 32, 64, 256, 4096, multiple=3) == 3
    objective = _objective(shards)

    def stream():
        return PretrainingStream(shards, objective=objective, batch_size=8, seq_len=64, seed=2,
                                 batch_ramp=(128, 1500), mix={"kjv": 0.5, "fortunes": 0.5})

    uninterrupted = list(itertools.islice(stream(), 12))
    sizes = [len(b["input_ids"]) for b in uninterrupted]
    assert sizes[0] == 2 and sizes[-1] == 8 and sizes == sorted(sizes), sizes
    first = stream()
    taken = list(itertools.islice(first, 5))
    resumed = stream()
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    rest = list(itertools.islice(resumed, 7))
    assert all(torch.equal(a[k], b[k]) for a, b in zip(uninterrupted, taken + rest) for k in a)
    with pytest.raises(LmlabError, match="mix"):
        PretrainingStream(shards, objective=objective, batch_size=8, seq_len=64,
                          seed=2).load_state_dict(first.state_dict())


def test_phased_stream_switches_lengths_and_resumes(shards):
    objective = _objective(shards)

    def phased():
        return PhasedStream([PretrainingStream(shards, objective=objective, batch_size=4,
                                               seq_len=n, seed=3) for n in (32, 64)], [3, None])

    uninterrupted = list(itertools.islice(phased(), 6))
    assert [b["input_ids"].shape[1] for b in uninterrupted] == [32, 32, 32, 64, 64, 64]
    for cut in (3, 4):  # at the switch and after it
        first = phased()
        taken = list(itertools.islice(first, cut))
        resumed = phased()
        resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
        assert resumed.seq_len == (32 if cut == 3 else 64)
        rest = list(itertools.islice(resumed, 6 - cut))
        assert all(torch.equal(a[k], b[k])
                   for a, b in zip(uninterrupted, taken + rest) for k in a)


def test_schedule_ramp_and_mix_resume_after_the_switch_bit_identical(shards, tmp_path):
    """`lmlab pretrain` with all three in fresh processes: the uninterrupted run, then the same
    run stopped after its step-4 checkpoint (past the switch at step 3: its later checkpoints,
    model and reports gone, its metrics logged past the checkpoint) and resumed by the same
    command: every step's loss and the final weights equal, bit for bit."""
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    args = ["pretrain", "--family", "bert", "--size", "tiny", "--shards", shards,
            "--seq-len-schedule", "32:0.5,64:0.5", "--batch-size", "4", "--batch-ramp", "500",
            "--batch-ramp-start", "64", "--mix", "kjv=0.5,fortunes=0.2,jargon=0.3",
            "--steps", "6", "--save-every", "1", "--keep-last", "10", "--log-every", "1",
            "--eval-batches", "1", "--precision", "fp32", "--threads", "1", "--lr", "1e-3"]
    result = run_lmlab(*args, "--out", whole)
    assert result.returncode == 0, result.stderr[-3000:]
    shutil.copytree(whole, cut)
    for path in ["checkpoints/step-5", "checkpoints/step-6", "model", "report.md"]:
        shutil.rmtree(cut / path) if (cut / path).is_dir() else (cut / path).unlink()
    result = run_lmlab(*args, "--out", cut)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming from" in result.stdout and "(step 4," in result.stdout
    assert "source mixture: fortunes 20% of the examples (its " in result.stdout

    def steps(run):
        return [(r["step"], r["tokens"], r["loss"]) for r in read_metrics(run / "metrics.jsonl")
                if r["kind"] == "train"]

    assert steps(cut) == steps(whole) and [s for s, _, _ in steps(whole)] == list(range(1, 7))
    tokens = [t for _, t, _ in steps(whole)]
    assert tokens[0] == 64 and tokens[2] - tokens[1] == 64  # the ramp: 2 sequences of 32
    assert ((cut / "model" / "model.safetensors").read_bytes()
            == (whole / "model" / "model.safetensors").read_bytes())
    saved = json.loads((whole / "config.json").read_text())
    assert saved["hparams"]["seq_len"] == 64 and saved["hparams"]["mix"] == {
        "fortunes": 0.2, "jargon": 0.3, "kjv": 0.5}
    # the cost report counts each step's tokens at its phase's length (3 steps at each)
    from lmlab.cost.flops import flops_per_token
    from lmlab.models.config import TransformerConfig

    config = TransformerConfig.from_dict(saved["model"])
    fraction = _objective(shards).predicted_fraction  # the masked positions pay the head
    expected = sum(n * flops_per_token(config, length, sparse_prediction_fraction=fraction)
                   for n, length in ((tokens[2], 32), (tokens[5] - tokens[2], 64)))
    assert json.loads((whole / "cost.json").read_text())["flops"] == pytest.approx(expected,
                                                                                 rel=1e-12)


@pytest.mark.parametrize("flags,problem", [
    (["--mix", "kjv=0.5,wordnet=0.5"], "does not hold: wordnet"),
    (["--mix", "kjv=0.5,jargon=0.4"], "sum to 0.9"),
    (["--mix", "kjv"], "cannot read the mixture weight"),
    (["--seq-len-schedule", "32:0.5,64:0.4"], "sum to 0.9"),
    (["--seq-len-schedule", "32:0.9,64:0.1", "--seq-len", "32"], "not the longest"),
    (["--seq-len-schedule", "32:0.9,64:0.1", "--steps", None, "--budget", "1m"],
     "has no step count"),
    (["--seq-len-schedule", "32:0.99,64:0.01"], "gets no step"),
    (["--batch-ramp", "1000", "--batch-ramp-start", "4096"], "nothing to ramp"),
    (["--batch-ramp", "0"], "--batch-ramp"),
])
def test_bad_schedule_ramp_and_mix_are_refused_before_any_work(shards, tmp_path, flags, problem):
    args = ["pretrain", "--family", "bert", "--size", "tiny", "--shards", str(shards),
            "--batch-size", "4", "--steps", "10", "--out", str(tmp_path / "run")]
    if None in flags:  # drop --steps
        index = args.index("--steps")
        del args[index:index + 2]
        flags = [f for f in flags if f not in ("--steps", None)]
    result = run_lmlab_here(*args, *flags)
    assert_clean_refusal(result, problem)
    assert not (tmp_path / "run").exists()


def test_mix_on_shards_without_sources_is_refused(shards, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(shards, old)
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["splits"]["train"]["sources"]  # what an older lmlab wrote
    (old / "manifest.json").write_text(json.dumps(manifest))
    result = run_lmlab_here("pretrain", "--family", "bert", "--size", "tiny", "--shards", old,
                            "--steps", "1", "--mix", "kjv=1", "--out", tmp_path / "run")
    assert_clean_refusal(result, "does not record its documents' sources")
    assert parse_mix({"b": 0.5, "a": 0.5}) == {"a": 0.5, "b": 0.5}
