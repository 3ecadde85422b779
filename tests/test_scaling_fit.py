"""lmlab.cost.scaling (Kaplan-style power-law fits and the compute frontier) and
scripts/scaling_fit.py at toy size."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

from lmlab.cost.estimate import PF_DAY_FLOPS
from lmlab.cost.flops import flops_per_token
from lmlab.cost.scaling import compute_frontier, fit_power_law
from lmlab.models.config import TransformerConfig
from lmlab.utils.errors import LmlabError

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "scaling_fit.py"


def test_fit_recovers_a_known_power_law():
    x = np.logspace(-8, -2, 9)  # PF-days, as GPT-3's Figure 3.1
    law = fit_power_law(x, 2.57 * x ** -0.048)
    # tol: exact data, float64 least squares over 9 points: rounding only
    assert law.a == pytest.approx(2.57, rel=1e-9) and law.b == pytest.approx(0.048, rel=1e-9)
    assert law.r2 == pytest.approx(1.0, abs=1e-12) and law.points == 9
    assert law(1e-4) == pytest.approx(2.57 * 1e-4 ** -0.048, rel=1e-9)


def test_fit_under_noise_and_r2_is_in_log_space():
    rng = np.random.default_rng(0)
    x = np.logspace(3, 7, 40)
    y = 9.0 * x ** -0.076 * np.exp(rng.normal(0, 0.01, x.size))  # 1% multiplicative noise
    law = fit_power_law(x, y)
    # tol: 40 points with 1% log-noise over 4 decades: the slope's standard error is ~6e-4
    assert law.b == pytest.approx(0.076, abs=4e-3)
    ly = np.log(y)
    residual = np.sum((ly - np.log(law(x))) ** 2)
    assert law.r2 == pytest.approx(1 - residual / np.sum((ly - ly.mean()) ** 2), rel=1e-9)
    assert 0.5 < law.r2 < 1.0


def test_frontier_is_the_lower_envelope():
    # two sizes' learning curves: the small one is best early, the large one late
    compute = [1, 2, 4, 8, 3, 6, 12, 24, 2]
    loss = [6.0, 5.0, 4.6, 4.5, 5.5, 4.4, 4.0, 3.7, 5.0]  # the last ties (2, 5.0): not kept
    assert compute_frontier(compute, loss) == [0, 1, 2, 5, 6, 7]
    assert compute_frontier([5.0], [1.0]) == [0]


@pytest.mark.parametrize("x, y, match", [
    ([1, 2, 3], [1, 2], "3 x and 2 y"), ([1, 2], [3, 2], "at least 3 points"),
    ([2, 2, 2], [3, 2, 1], "2 distinct x"), ([1, -2, 3], [3, 2, 1], "x > 0"),
    ([1, 2, 3], [3, 0, 1], "y > 0"), ([1, 2, math.nan], [3, 2, 1], "finite x")])
def test_fit_refuses_bad_points(x, y, match):
    with pytest.raises(LmlabError, match=match):
        fit_power_law(x, y)


def test_frontier_refuses_bad_points():
    with pytest.raises(LmlabError, match="one finite loss"):
        compute_frontier([1, 2], [1.0])
    with pytest.raises(LmlabError, match="compute > 0"):
        compute_frontier([0, 2], [1.0, 2.0])


def _script():
    spec = importlib.util.spec_from_file_location("scaling_fit", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_script_end_to_end_at_toy_size(tmp_path):
    """Corpus, BPE tokens, three decoders, the fits and the plot; C from the cost reports."""
    from lmlab.data.build import build_corpus

    build_corpus(["kjv"], tmp_path / "corpus", max_documents=30, validation_fraction=0.2,
                 exclude_tasks=())  # the script builds the default corpus without --corpus
    script = _script()
    out = tmp_path / "out"
    assert script.main(["--out", str(out), "--work", str(tmp_path / "work"), "--corpus",
                        str(tmp_path / "corpus"), "--vocab-size", "300", "--sizes", "1x8,1x16,2x16", "--steps", "4",
                        "--evals", "2", "--batch-size", "4", "--seq-len", "16",
                        "--eval-batches", "1", "--threads", "1"]) == 0
    result = json.loads((out / "scaling.json").read_text())
    assert [r["size"] for r in result["runs"]] == ["1x8", "1x16", "2x16"]
    for r in result["runs"]:
        run = next((tmp_path / "work" / "stages").glob(f"pretrain-{r['size']}-*")) / "run"
        config = TransformerConfig.from_dict(json.loads((run / "config.json").read_text())["model"])
        assert r["non_embedding_parameters"] == config.num_parameters(include_embeddings=False)
        assert r["flops_per_token"] == flops_per_token(config, 16, head="clm")
        assert [p["tokens"] for p in r["points"]] == [128, 256]  # steps 2 and 4 of 4 x 16 tokens
        for p in r["points"]:
            assert p["flops"] == p["tokens"] * r["flops_per_token"]
            assert p["kaplan_flops"] == 6 * r["non_embedding_parameters"] * p["tokens"]
    front = result["analysis"]["compute"]["frontier"]
    assert [p["pf_days"] for p in front] == sorted(p["pf_days"] for p in front)
    assert front[0]["pf_days"] == pytest.approx(32 * result["runs"][0]["flops_per_token"]
                                                / PF_DAY_FLOPS)
    assert result["analysis"]["parameters"]["points"] == 3
    assert 0 < result["analysis"]["unigram_loss"] < 2 * math.log(300)
    assert result["stage_seconds"]["pretraining"] == pytest.approx(
        sum(r["stage_seconds"] for r in result["runs"])) and result["threads"] == 1
    assert (out / "scaling.png").stat().st_size > 10_000
    assert "| 1x8 |" in (out / "scaling.md").read_text()
    assert script.main(["--out", str(out), "--sizes", "2x16,2x16"]) == 2  # refused before work
