"""Symbolic integration data and verification (lmlab.tasks.integration): deterministic
generation, disjoint splits, prefix notation both ways, and a verifier that accepts every
correct antiderivative however it is written and rejects wrong ones."""

from __future__ import annotations

import time

import pytest
import sympy

from lmlab.tasks.integration import (
    Grammar,
    Verdict,
    fingerprint,
    from_prefix,
    make_splits,
    overlap,
    skeleton,
    time_limit,
    to_prefix,
    verify,
)
from lmlab.tasks.integration_data import generate_pairs
from lmlab.tasks.types import TextPair
from lmlab.utils.errors import LmlabError

x = sympy.Symbol("x")


@pytest.fixture(scope="module")
def pairs() -> list[TextPair]:
    return generate_pairs(200, seed=0)


def test_generation_is_deterministic_and_distinct(pairs):
    again = generate_pairs(200, seed=0)
    assert again == pairs
    assert generate_pairs(20, seed=1) != pairs[:20]
    assert len({p.input_text for p in pairs}) == 200


def test_every_pair_is_a_function_and_its_derivative(pairs):
    """The reference answer verifies, by the exact derivative too (sympy, not the verifier)."""
    for pair in pairs[:60]:
        function = from_prefix(pair.target.split())
        derivative = from_prefix(pair.input_text.split())
        assert sympy.simplify(sympy.diff(function, x) - derivative) == 0, pair
        assert verify(pair.target, pair.input_text).correct, pair
    assert all(not from_prefix(p.input_text.split()).has(sympy.zoo, sympy.nan, sympy.oo)
               for p in pairs)


def test_splits_share_no_item_and_are_stable(pairs):
    splits = make_splits(pairs)
    inputs = {name: {p.input_text for p in split} for name, split in splits.items()}
    assert not inputs["train"] & inputs["dev"] and not inputs["train"] & inputs["test"]
    assert not inputs["dev"] & inputs["test"]
    assert sum(map(len, splits.values())) == len(pairs)
    assert 0.65 < len(splits["train"]) / len(pairs) < 0.95
    # another draw that holds some of the same inputs puts them in the same splits
    other = make_splits(generate_pairs(300, seed=0))
    for name in splits:
        assert inputs[name] <= {p.input_text for p in other[name]}


def test_one_pair_per_function_however_written(pairs):
    """Keys are fingerprints of f: distinct across the pairs and recomputable from the input."""
    assert len({p.key for p in pairs}) == len(pairs)
    assert all(fingerprint(from_prefix(p.input_text.split())) == p.key for p in pairs[:20])


def test_fingerprint_merges_forms_and_only_forms():
    assert fingerprint(sympy.exp(x) * sympy.exp(-x) * x) == fingerprint(x)
    assert fingerprint(2 * sympy.sin(x) * sympy.cos(x)) == fingerprint(sympy.sin(2 * x))
    assert fingerprint(sympy.sin(x) ** 2 + sympy.cos(x) ** 2 + x) == fingerprint(x + 1)
    assert fingerprint(x + 1) != fingerprint(x + sympy.Rational(1, 10**9))
    towers = [sympy.exp(sympy.exp(sympy.exp(sympy.exp(x + c)))) for c in (3, 4)]
    assert fingerprint(towers[0]) != fingerprint(towers[1])  # no values: the form decides


def test_overlap_counts_structure_shared_with_train():
    """By hand: 3x + 2 in train; 5x - 1 (same structure), x^2 (new) and 2 + 3x (the same
    function written another way, which splitting by function keeps out) in test."""
    def pair(expression):
        expr = sympy.sympify(expression)
        return TextPair(" ".join(to_prefix(expr)), ("x",), fingerprint(expr))

    train = [pair("3*x + 2")]
    assert skeleton(train[0].input_text) == "add N mul N x"
    report = overlap({"train": train, "dev": [], "test": [pair("5*x - 1"), pair("x**2")]})
    assert report == {"test": {"input": 0.0, "function": 0.0, "input_skeleton": 0.5,
                               "target_skeleton": 1.0}}
    same = TextPair("add mul INT+ 3 x INT+ 2", ("x",), fingerprint(3 * x + 2))
    assert same.key == train[0].key and same.input_text != train[0].input_text
    assert sorted(map(len, make_splits([same, *train]).values())) == [0, 0, 2]  # one split


@pytest.mark.parametrize("expression", [
    "x**3 + 2*x", "exp(sin(x))", "log(x**2 + 1)", "cos(x)*x - 3", "sqrt(x)", "1/x",
    "exp(-2*x)/5", "sin(x)**2", "atanh(tan(x)) - acosh(x)/asin(x)", "sqrt(x + 1)*atan(x)",
    "sinh(x)**(-1/2) + cosh(acos(x)) + tanh(asinh(2*x))",
])
def test_prefix_round_trip(expression):
    expr = sympy.sympify(expression)
    assert from_prefix(to_prefix(expr)) == expr


@pytest.mark.parametrize("tokens,match", [
    (["add", "x"], "ends early"),
    (["x", "x"], "left over"),
    (["erf", "x"], "unknown token 'erf'"),
    (["INT+"], "without digits"),
])
def test_malformed_prefix_is_a_clear_error(tokens, match):
    with pytest.raises(LmlabError, match=match):
        from_prefix(tokens)


def test_verifier_accepts_correct_answers_in_other_forms():
    derivative = to_prefix(sympy.sympify("2*sin(x)*cos(x)"))
    for answer in ("sin(x)**2", "-cos(x)**2", "sin(x)**2 + 7"):  # a constant apart
        assert verify(to_prefix(sympy.sympify(answer)), derivative).correct, answer
    # log(x**2) and 2*log(x) have the same derivative, 2/x
    assert verify(to_prefix(sympy.sympify("log(x**2)")), to_prefix(2 / x)).correct
    assert verify(to_prefix(2 * sympy.log(x)), to_prefix(2 / x)).correct


def test_verifier_rejects_wrong_and_unparsable_answers():
    derivative = to_prefix(sympy.sympify("2*sin(x)*cos(x)"))
    wrong = verify(to_prefix(sympy.sympify("sin(x)**3")), derivative)
    assert not wrong.correct and wrong.method == "numeric-mismatch"
    assert not verify(["add", "x"], derivative).correct
    # an answer with no value where f has one is wrong, not undecidable: x/0 is sympy's zoo
    assert verify("div x INT+ 0", "INT+ 1") == Verdict(False, "numeric-mismatch")
    assert verify("add x", derivative).method == "unparsable"
    # a derivative off by 1e-3 is wrong at the default tolerance (1e-6 of max(1, |f|)) and
    # right at a looser one
    nearly = to_prefix(sympy.sympify("sin(x)**2 + x/1000"))
    assert not verify(nearly, derivative).correct
    assert verify(nearly, derivative, rtol=1e-2).correct


def test_verifier_does_not_depend_on_branches_or_the_seed():
    """x^2 log(x^2) and 2 x^2 log(x) differ on the complex plane's left half (a branch of log),
    not on the reals where the task lives: every seed accepts both."""
    derivative = to_prefix(sympy.diff(x**2 * sympy.log(x**2), x))
    answer = to_prefix(2 * x**2 * sympy.log(x))
    assert all(verify(answer, derivative, seed=seed).correct for seed in range(8))


def _check(answer, derivative, **kwargs):
    """verify() on sympy expressions, under a generous guard so that a hang fails the test."""
    with time_limit(60):
        return verify(to_prefix(answer), to_prefix(derivative), **kwargs)


def test_a_short_wrong_answer_to_a_towering_derivative_does_not_hang():
    """`cos x` for the derivative of exp(exp(exp(x^3))): evaluating it at x near 3 would build
    an exponent of ~10^11 digits; the check refuses such values and still decides."""
    tower = sympy.exp(sympy.exp(sympy.exp(x**3)))
    verdict = _check(sympy.cos(x), sympy.diff(tower, x))
    assert verdict == Verdict(False, "numeric-mismatch")
    assert _check(tower, sympy.diff(tower, x)).correct


def test_a_tiny_derivative_is_held_to_its_own_size():
    """f = -135 e^(-135x) is below 1e-6 on most of (0.1, 3); G = e^(-136x) is wrong there by a
    factor, which an absolute floor of 1e-6 accepted."""
    f = -135 * sympy.exp(-135 * x)
    assert _check(sympy.exp(-136 * x), f) == Verdict(False, "numeric-mismatch")
    assert _check(sympy.exp(-135 * x), f).correct
    assert _check(sympy.exp(-135 * x) - 4, f).correct


@pytest.mark.parametrize("function", [sympy.exp(200 * x), sympy.exp(sympy.exp(x**2))])
def test_a_missing_term_beside_a_huge_one_is_rejected(function):
    """f = F' + 1 with |F'| from 1e10 to 1e3500 on (0.1, 3): G = F misses the x, which a purely
    relative check at those points cannot see; points where |f| is moderate do."""
    f = sympy.diff(function, x) + 1
    assert not _check(function, f).correct
    assert _check(function + x, f).correct
    assert _check(x + function - 3, f).correct


def test_what_the_check_cannot_decide_is_unverifiable_not_correct():
    tower = sympy.exp(sympy.exp(sympy.exp(sympy.exp(x + 3))))  # overflows at every point
    f = sympy.diff(tower, x)
    assert _check(tower, f) == Verdict(True, "simplify")
    undecided = _check(tower + x, f)
    assert undecided == Verdict(False, "undecided") and undecided.unverifiable
    late = _check(sympy.sin(x) ** 2, 2 * sympy.sin(x) * sympy.cos(x), timeout=1e-4)
    assert late == Verdict(False, "timeout") and late.unverifiable
    assert not _check(sympy.sin(x) ** 3, 2 * sympy.sin(x) * sympy.cos(x)).unverifiable


def test_huge_numbers_in_a_prediction_are_refused_quickly():
    derivative = to_prefix(sympy.sympify("2*x"))
    assert verify(["pow", "INT+", "9", "9", "INT+"] + ["9"] * 9, derivative).method == \
        "unparsable"
    assert verify(["INT+"] + ["9"] * 40, derivative).method == "unparsable"


def test_time_limit_interrupts_slow_work():
    with pytest.raises(TimeoutError):
        with time_limit(0.2):
            time.sleep(30)  # without the limit: no TimeoutError, the test fails


def test_bad_requests_are_refused():
    with pytest.raises(LmlabError, match="at least 1"):
        generate_pairs(0, seed=0)
    with pytest.raises(LmlabError, match="bounds must be positive"):
        Grammar(max_ops=0)
    with pytest.raises(LmlabError, match="p_x"):
        Grammar(p_x=0.0)
    with pytest.raises(LmlabError, match="sum to 1"):
        make_splits([], fractions=(0.5, 0.5, 0.5))
