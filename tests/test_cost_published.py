"""The papers' published training compute recomputed (`lmlab cost published`, `lmlab cost
estimate`): GPT-3's sizes have the paper's parameter counts, their 6·N·D is Table D.1's figure,
lmlab's fuller count differs by exactly the attention scores and the head, and PF-s-days are
FLOPs / 8.64e19."""

from __future__ import annotations

import pytest
from conftest import run_lmlab_here

from lmlab.cost.estimate import estimate_run
from lmlab.cost.facts import facts
from lmlab.cost.presets import preset_config
from lmlab.cost.published import published_costs


@pytest.fixture(scope="module")
def rows() -> dict[str, dict]:
    return {row["model"]: row for row in published_costs()}


def test_published_flops_are_six_n_d_and_lmlab_has_the_papers_shapes(rows):
    for entry in facts()["published_costs"]:
        if entry.get("flops"):  # Table D.1's convention: 6 x parameters x tokens
            # tol: published FLOP counts are given to two or three significant figures
            assert 6 * entry["params"] * entry["tokens"] == pytest.approx(entry["flops"],
                                                                          rel=0.01)
            # tol: PF-s-days as published, rounded to three or four figures
            assert entry["flops"] / 8.64e19 == pytest.approx(entry["pf_days"], rel=0.01)
    # GPT-3's shapes (Table 2.1) give its parameter counts: 6·N·D with lmlab's N is the figure
    # tol: the paper's 175B against the preset's exact count, to its four figures
    assert rows["gpt3-175b"]["params"] == pytest.approx(174.6e9, rel=1e-3)
    for model in ("gpt3-small", "gpt3-xl", "gpt3-175b"):
        # tol: 6ND against published totals quoted to two or three figures
        assert rows[model]["six_n_d"] == pytest.approx(rows[model]["published_flops"], rel=0.01)


def test_gpt3_175b_by_hand():
    """3.14e23 FLOPs = 3,640 PF-s-days is 6·N·D; lmlab counts the layers' matmuls, the
    attention scores 6·N·D leaves out (12·L·S·d) and the tied output projection (6·d·V, where
    6·N·D counts the embedding matrix), not the position embeddings: exactly, by hand."""
    layers, d, seq, vocab = 96, 12288, 2048, 50257
    estimate = estimate_run("gpt3-175b", 300e9, seq_len=2048)
    by_hand = 6 * 12 * layers * d * d + 12 * layers * seq * d + 6 * d * vocab
    assert estimate.flops_per_token == by_hand
    assert estimate.pf_days == pytest.approx(estimate.total_flops / (1e15 * 86400), rel=1e-12)
    # tol: a hand formula's total written to four figures
    assert estimate.total_flops == pytest.approx(3.229e23, rel=1e-3)  # 2.8% above 3.14e23
    half = estimate_run("gpt3-175b", 300e9, seq_len=2048, causal_attention="half")
    assert half.flops_per_token == by_hand - 6 * layers * seq * d  # Kaplan's half scores
    # tol: the paper's 3,640 PF-s-days, quoted to three figures
    assert preset_config("gpt3-175b").num_parameters() * 6 * 300e9 / 8.64e19 == pytest.approx(
        3640, rel=0.002)


def test_xlnet_implied_mfu_and_money(rows):
    xlnet = rows["xlnet-large"]
    assert xlnet["tokens"] == 500_000 * 8192 * 512
    assert xlnet["implied_mfu"] == pytest.approx(xlnet["flops"] / (132 * 3600 * 512 * 123e12))
    # 5.5 days on 512 chips at $2 a chip-hour ($8 for a 4-chip v3 device)
    assert xlnet["money"] == 512 * 132 * 2.0 == 135_168
    # the quoted figure: the first version's 2.5 days on 128 devices at $8
    assert xlnet["published_money"] == 128 * 60 * 8 == 61_440
    # the permutation LM predicts 1/6 of the tokens: fewer FLOPs than predicting all
    assert xlnet["flops"] < estimate_run("xlnet-large", xlnet["tokens"], seq_len=512,
                                         head="plm").total_flops


def test_cost_published_and_estimate_print_pf_days():
    result = run_lmlab_here("cost", "published")
    assert result.returncode == 0, result.stderr
    assert "| GPT-3 175B | 174,604M | 3e+11 | 3.14e+23 | 3.64e+03 | 3.23e+23 |" in result.stdout
    assert "`lmlab cost estimate --model gpt3-175b --tokens 3e+11 --seq-len 2048`" in result.stdout
    result = run_lmlab_here("cost", "estimate", "--model", "gpt3-175b", "--tokens", "300e9",
                            "--seq-len", "2048")
    assert result.returncode == 0 and "= 3,737 PF-s-days" in result.stdout
