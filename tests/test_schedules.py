"""Learning-rate curves, checked point by point against their definitions."""

from __future__ import annotations

import math

import pytest

from lmlab.training.schedules import Schedule, estimate_horizon, triangular


def curve(schedule: Schedule, total: int) -> list[float]:
    return [schedule.factor(s, total) for s in range(total + 1)]


def test_linear_warmup_then_decay_matches_hf_formula():
    sched = Schedule("linear", warmup_steps=10)
    values = curve(sched, 100)
    assert values[0] == 0.0 and values[5] == 0.5 and values[10] == 1.0
    assert values[55] == pytest.approx((100 - 55) / (100 - 10))
    assert values[100] == 0.0
    assert all(a <= b for a, b in zip(values[:10], values[1:11]))
    assert all(a >= b for a, b in zip(values[10:], values[11:]))


def test_linear_with_floor_and_warmup_fraction():
    sched = Schedule("linear", warmup_fraction=0.1, min_lr_ratio=0.1)
    assert sched.factor(5, 100) == pytest.approx(0.5)
    assert sched.factor(100, 100) == pytest.approx(0.1)
    assert sched.factor(55, 100) == pytest.approx(0.1 + 0.9 * 0.5)


def test_cosine():
    sched = Schedule("cosine", warmup_steps=10)
    assert sched.factor(10, 110) == pytest.approx(1.0)
    assert sched.factor(60, 110) == pytest.approx(0.5)
    assert sched.factor(110, 110) == pytest.approx(0.0, abs=1e-12)
    assert sched.factor(35, 110) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.25)))


def test_constant_with_warmup():
    sched = Schedule("constant", warmup_steps=4)
    assert curve(sched, 8) == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0]


def test_inverse_sqrt_is_noam_normalised():
    sched = Schedule("inverse_sqrt", warmup_steps=16)
    # Noam: d^-0.5 min(s^-0.5, s w^-1.5), divided by its peak w^-0.5 at s = w
    for s in (1, 8, 16, 64, 400):
        noam = min(s ** -0.5, s * 16 ** -1.5) / 16 ** -0.5
        assert sched.factor(s, math.inf) == pytest.approx(noam)
    assert sched.factor(64, 10) == pytest.approx(0.5)  # needs no horizon


def test_slanted_triangular_ulmfit():
    total, cut_frac, ratio = 1000, 0.1, 32
    sched = Schedule("triangular", cut_frac=cut_frac, ratio=ratio)
    assert sched.factor(0, total) == pytest.approx(1 / ratio)
    assert sched.factor(100, total) == pytest.approx(1.0)  # cut = 100
    assert sched.factor(50, total) == pytest.approx((1 + 0.5 * 31) / 32)
    # after the cut: p = 1 - (t - cut) / (cut (1/cut_frac - 1))
    assert sched.factor(550, total) == pytest.approx((1 + 0.5 * 31) / 32)
    assert sched.factor(1000, total) == pytest.approx(1 / ratio)
    assert triangular(100, math.inf) == 1.0


def test_unknown_horizon_holds_decay():
    assert Schedule("linear", warmup_steps=2).factor(50, math.inf) == 1.0


def test_horizon_estimates():
    assert estimate_horizon(0, 0, 0.0, 100, None, None) == 100
    assert math.isinf(estimate_horizon(0, 0, 0.0, None, None, 60.0))
    # 10 steps in 6 s of a 60 s budget: 100 steps
    assert estimate_horizon(10, 0, 6.0, None, None, 60.0) == pytest.approx(100)
    # tokens: 10 steps made 1,000 tokens of 50,000
    assert estimate_horizon(10, 1000, 1.0, None, 50_000, None) == pytest.approx(500)
    # whichever limit comes first
    assert estimate_horizon(10, 1000, 6.0, 80, 50_000, 60.0) == 80
