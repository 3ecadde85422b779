"""Symbolic integration as an inverse problem (Lample & Charton 2020): random functions from a
grammar (ours, small, or the paper's), prefix notation both ways, a numeric fingerprint of a
function (one item per function, however written), how much structure the splits share, and
:func:`verify`, which judges a predicted antiderivative by differentiating it (docs/tasks.md).
The generators of pairs are in :mod:`lmlab.tasks.integration_data`.
"""

from __future__ import annotations

import functools
import operator
import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmlab.tasks.types import TextPair
from lmlab.utils.errors import LmlabError

UNARY = ("exp", "log", "sin", "cos")
#: every unary function of the prefix vocabulary: Lample & Charton's fifteen
FUNCTIONS = ("exp", "log", "sqrt", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh",
             "tanh", "asinh", "acosh", "atanh")
MAX_DIGITS = 12  # integer literals a prediction may hold: sympy evaluates numbers eagerly
MAX_EXPONENT = 64
BINARY = ("add", "sub", "mul", "pow")
OPERATORS = ("add", "sub", "mul", "div", "pow")
SMALL_POWERS = (2, 3)
ARITY = {**dict.fromkeys(OPERATORS, 2), **dict.fromkeys(FUNCTIONS, 1)}


# -- time limits --------------------------------------------------------------------------------
@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise ``TimeoutError`` in the block after ``seconds``: sympy cannot be interrupted
    otherwise (a POSIX interval timer, so main thread only; elsewhere no limit)."""
    usable = (seconds > 0 and hasattr(signal, "setitimer")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    def expire(signum, frame):
        raise TimeoutError(f"sympy took longer than {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# -- the grammar ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Grammar:
    """Bounds of the random functions: ``max_ops`` operators at most (at least one), trees at
    most ``max_depth`` deep, integer leaves in ``[-max_int, max_int]`` without 0, and a leaf is
    ``x`` with probability ``p_x``; a unary operator is drawn with probability ``p_unary``, from
    ``unary``, a binary one from ``binary`` (``pow``: to a small integer power). ``uniform``:
    trees drawn uniformly among those of their operator count, as Lample & Charton do
    (``max_depth`` and ``p_unary`` unused); see :data:`PAPER_GRAMMAR`."""

    max_ops: int = 5
    max_depth: int = 4
    max_int: int = 5
    p_x: float = 0.6
    p_unary: float = 0.35
    unary: tuple[str, ...] = UNARY
    binary: tuple[str, ...] = BINARY
    uniform: bool = False

    def __post_init__(self) -> None:
        if self.max_ops < 1 or self.max_depth < 1 or self.max_int < 1:
            raise LmlabError(f"grammar bounds must be positive: {self}",
                             "use e.g. Grammar(max_ops=5, max_depth=4, max_int=5)")
        if not 0.0 < self.p_x <= 1.0 or not 0.0 <= self.p_unary <= 1.0:
            raise LmlabError(f"grammar probabilities out of range: p_x {self.p_x} must be in "
                             f"(0, 1] (functions must contain x), p_unary {self.p_unary} in "
                             "[0, 1]", "use e.g. p_x=0.6, p_unary=0.35")
        unknown = sorted(set(self.unary) - set(FUNCTIONS)) + \
            sorted(set(self.binary) - set(OPERATORS))
        if self.uniform and "pow" in self.binary:
            raise LmlabError("uniform trees take no pow (its exponent is a small integer)",
                             "use binary=('add', 'sub', 'mul', 'div') with uniform=True")
        if unknown or not self.binary or not self.unary:
            raise LmlabError(f"grammar operators {unknown or 'missing'} are not in the prefix "
                             "vocabulary", f"unary from {', '.join(FUNCTIONS)}; binary from "
                             f"{', '.join(OPERATORS)}; at least one of each")


#: Lample & Charton's expressions: up to 15 internal nodes, uniform over trees, the four binary
#: operators and the fifteen unary functions, integers -5..5
PAPER_GRAMMAR = Grammar(max_ops=15, max_depth=15, unary=FUNCTIONS,
                        binary=("add", "sub", "mul", "div"), uniform=True)
GRAMMARS = {"small": Grammar(), "paper": PAPER_GRAMMAR}


def _random_tree(rng: np.random.Generator, grammar: Grammar, ops: int, depth: int) -> list[str]:
    """A random prefix expression with ``ops`` operators and at most ``depth`` levels."""
    if ops == 0 or depth == 0:
        return _leaf(rng, grammar)
    if rng.random() < grammar.p_unary:
        return [str(rng.choice(grammar.unary))] + _random_tree(rng, grammar, ops - 1, depth - 1)
    op = str(rng.choice(grammar.binary))
    if op == "pow":  # polynomial powers: a subtree to a small integer power
        return ["pow"] + _random_tree(rng, grammar, ops - 1, depth - 1) + \
            _int_tokens(int(rng.choice(SMALL_POWERS)))
    left = int(rng.integers(0, ops))  # operators in the left subtree
    return [op] + _random_tree(rng, grammar, left, depth - 1) + \
        _random_tree(rng, grammar, ops - 1 - left, depth - 1)


def _leaf(rng: np.random.Generator, grammar: Grammar) -> list[str]:
    if rng.random() < grammar.p_x:
        return ["x"]
    value = int(rng.integers(1, grammar.max_int + 1)) * (1 if rng.random() < 0.5 else -1)
    return _int_tokens(value)


def _tree_counts(ops: int, unary: int, binary: int) -> list[list[int]]:
    """``D[e][n]``: trees with ``n`` operators that fill ``e`` empty slots, operators counted
    (Lample & Charton's appendix C: D(e, n) = D(e-1, n) + p1 D(e, n-1) + p2 D(e+1, n-1))."""
    width = ops + 2
    counts = [[0] * (ops + 1) for _ in range(2 * width)]
    for e in range(2 * width):
        counts[e][0] = 1
    for n in range(1, ops + 1):
        for e in range(1, 2 * width - 1):
            counts[e][n] = counts[e - 1][n] + unary * counts[e][n - 1] + \
                binary * counts[e + 1][n - 1]
    return counts


def _uniform_tree(rng: np.random.Generator, grammar: Grammar, ops: int) -> list[str]:
    """A prefix expression drawn uniformly among those with ``ops`` operators (operator
    labels included), by the paper's algorithm: the next operator goes after ``k`` leaves, with
    arity ``a``, in proportion to the trees that can follow."""
    counts = _tree_counts(ops, len(grammar.unary), len(grammar.binary))
    slots: list[str | None] = [None]  # the prefix sequence so far; None: a leaf or open slot
    open_slots, left, cursor = 1, ops, 0
    while left:
        choices, weights = [], []
        for k in range(open_slots):  # k open slots become leaves, then an operator
            for arity, size in ((1, len(grammar.unary)), (2, len(grammar.binary))):
                weights.append(size * counts[open_slots - k + arity - 1][left - 1])
                choices.append((k, arity))
        total = sum(weights)  # Python integers: the counts outgrow 64 bits
        k, arity = choices[int(rng.choice(len(choices), p=[w / total for w in weights]))]
        for _ in range(k):  # skip k open slots (leaves)
            cursor = slots.index(None, cursor) + 1
        at = slots.index(None, cursor)
        slots[at:at + 1] = ["u" if arity == 1 else "b"] + [None] * arity
        cursor = at + 1
        open_slots += arity - 1 - k  # k slots became leaves, one an operator with arity
        left -= 1
    tokens: list[str] = []
    for slot in slots:
        if slot is None:
            tokens += _leaf(rng, grammar)
        elif slot == "u":
            tokens.append(str(rng.choice(grammar.unary)))
        else:
            tokens.append(str(rng.choice(grammar.binary)))
    return tokens


def _int_tokens(value: int) -> list[str]:
    """Integers as a sign token and digits (``INT- 1 2`` for -12), as Lample & Charton do."""
    return ["INT+" if value >= 0 else "INT-"] + list(str(abs(value)))


def _function_of_constant(tokens: Sequence[str]) -> bool:
    """Does a unary function in the prefix expression ``tokens`` apply to a subtree without
    ``x``?"""
    found = False

    def walk(i: int) -> tuple[bool, int]:  # (the subtree at i holds x, where it ends)
        nonlocal found
        token = tokens[i]
        if token in ("INT+", "INT-"):
            i += 1
            while i < len(tokens) and tokens[i].isdigit():
                i += 1
            return False, i
        if token not in ARITY:
            return token == "x", i + 1
        has_x, j = False, i + 1
        for _ in range(ARITY[token]):
            child, j = walk(j)
            has_x |= child
        found |= ARITY[token] == 1 and not has_x
        return has_x, j

    walk(0)
    return found


MAX_DRAWS = 10_000  # draws of random_function before the grammar is declared unusable


def random_function(rng: np.random.Generator, grammar: Grammar = Grammar()) -> Any:
    """A random sympy function of ``x`` from ``grammar`` (always depends on ``x``)."""
    import sympy

    x = sympy.Symbol("x")
    for _ in range(MAX_DRAWS):
        ops = int(rng.integers(1, grammar.max_ops + 1))
        tokens = _uniform_tree(rng, grammar, ops) if grammar.uniform else \
            _random_tree(rng, grammar, ops, grammar.max_depth)
        if grammar.uniform and _function_of_constant(tokens):
            continue  # atanh(4): the paper folds constants; sympy is slow on such (we redraw)
        try:
            expr = from_prefix(tokens)
        except (ZeroDivisionError, ValueError, OverflowError):  # e.g. a division by 0
            continue
        if expr.has(x) and not expr.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo):
            return expr
    raise LmlabError(f"{MAX_DRAWS} draws from {grammar} gave no function of x",
                     "raise p_x or max_ops")


# -- prefix notation ------------------------------------------------------------------------------
def to_prefix(expr: Any) -> list[str]:
    """``expr`` in prefix notation: n-ary sums and products folded into binary ``add``/``mul``,
    rationals as ``div``, square roots as ``sqrt``, integers as sign + digits."""
    import sympy

    if expr.is_Symbol:
        if expr.name != "x":
            raise LmlabError(f"unknown symbol {expr.name!r}", "expressions use the variable x only")
        return ["x"]
    if expr in (sympy.E, sympy.pi):
        return [str(expr)]  # "E", "pi"
    if expr.is_Integer:
        return _int_tokens(int(expr))
    if expr.is_Rational:
        return ["div"] + _int_tokens(int(expr.p)) + _int_tokens(int(expr.q))
    if expr.is_Add or expr.is_Mul:
        op = "add" if expr.is_Add else "mul"
        args = [to_prefix(arg) for arg in expr.args]
        out = args[-1]
        for arg in reversed(args[:-1]):
            out = [op] + arg + out
        return out
    if expr.is_Pow:
        if expr.exp == sympy.S.Half:
            return ["sqrt"] + to_prefix(expr.base)
        return ["pow"] + to_prefix(expr.base) + to_prefix(expr.exp)
    name = type(expr).__name__
    if name in FUNCTIONS:
        return [name] + to_prefix(expr.args[0])
    raise LmlabError(f"prefix notation has no token for {name} ({expr})",
                     f"expressions use integers, x, E, pi, {', '.join(OPERATORS)}, "
                     f"{', '.join(FUNCTIONS)}")


def from_prefix(tokens: Sequence[str]) -> Any:
    """The sympy expression of a prefix token sequence; a malformed one is an LmlabError that
    says where it went wrong."""
    import sympy

    x = sympy.Symbol("x")
    functions = {name: getattr(sympy, name) for name in FUNCTIONS}
    binary = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
              "pow": operator.pow, "div": operator.truediv}
    tokens = list(tokens)

    def parse(i: int):
        if i >= len(tokens):
            raise LmlabError(f"prefix expression ends early: {' '.join(tokens)}",
                             "every operator needs its operands")
        token = tokens[i]
        if token == "x":
            return x, i + 1
        if token in ("E", "pi"):
            return getattr(sympy, token), i + 1
        if token in ("INT+", "INT-"):
            j = i + 1
            while j < len(tokens) and tokens[j].isdigit():
                j += 1
            if j == i + 1:
                raise LmlabError(f"{token} without digits at token {i}", "write e.g. INT+ 1 2")
            if j - i - 1 > MAX_DIGITS:
                raise LmlabError(f"an integer of {j - i - 1} digits at token {i}",
                                 f"integers have at most {MAX_DIGITS} digits")
            value = int("".join(tokens[i + 1:j]))
            return sympy.Integer(value if token == "INT+" else -value), j
        if token in functions:
            arg, j = parse(i + 1)
            return functions[token](arg), j
        if token in binary:
            left, j = parse(i + 1)
            right, k = parse(j)
            if token == "pow" and right.is_Integer and abs(int(right)) > MAX_EXPONENT:
                # sympy would expand it at once (a huge integer power can take minutes)
                raise LmlabError(f"exponent {right} at token {i} is too large",
                                 f"integer exponents are at most {MAX_EXPONENT} in size")
            return binary[token](left, right), k
        raise LmlabError(f"unknown token {token!r} at position {i}",
                         f"prefix tokens are x, E, pi, INT+/INT- digits, {', '.join(binary)}, "
                         f"{', '.join(functions)}")

    expr, end = parse(0)
    if end != len(tokens):
        raise LmlabError(f"{len(tokens) - end} tokens left over after a complete expression",
                         "the sequence must be exactly one prefix expression")
    return expr


# -- data -----------------------------------------------------------------------------------------
def prefix_depth(tokens: Sequence[str]) -> int:
    """Operator depth of a prefix expression (``x`` 0, ``exp x`` 1, ``add x exp x`` 2)."""
    depth, stack = 0, []  # stack: operands still owed at each open level
    for token in tokens:
        if token.isdigit():  # digits belong to the INT+/INT- leaf before them
            continue
        level = len(stack)
        if token in ARITY:
            stack.append(ARITY[token])
            depth = max(depth, level + 1)
            continue
        while stack:  # a leaf fills one slot; completed operators close
            stack[-1] -= 1
            if stack[-1]:
                break
            stack.pop()
    return depth


def usable(expr) -> bool:
    """Real-valued in form and finite: free of sympy's infinities and undefined values (zoo,
    nan, oo) and of the imaginary unit (``log(-2)`` evaluates to ``log(2) + I*pi``)."""
    import sympy

    return not expr.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo, sympy.I)


FINGERPRINT_POINTS = (0.3183, 0.7071, 1.2345, 1.7321, 2.7183)  # fixed, generic


def fingerprint(expr: Any) -> str:
    """The function ``expr`` is, whatever its form: its values at five fixed points (30 digits,
    rounded to 12), so ``exp(x)*exp(-x)*x`` and ``x`` match; where fewer than two values exist
    (overflow, undefined) the expression's sympy form is added, so such functions never merge."""
    import mpmath

    values = []
    for point in FINGERPRINT_POINTS:
        try:
            with mpmath.workdps(DIGITS[0]):
                value = mpmath.mpc(_value(expr, mpmath.mpf(point)))
                text = mpmath.nstr(value.real, 12)
                if value.imag != 0:
                    text += f"{'+' if value.imag > 0 else ''}{mpmath.nstr(value.imag, 12)}j"
                values.append(text)
        except _Undefined:
            values.append("-")
    text = ",".join(values)
    return text if len(values) - values.count("-") >= 2 else f"{text}|{expr}"


def skeleton(tokens: Sequence[str] | str) -> str:
    """A prefix expression with every integer replaced by ``N``: its structure (``add mul N x
    N`` for 3x + 2 and for 5x - 1)."""
    out: list[str] = []
    for token in tokens.split() if isinstance(tokens, str) else tokens:
        if token.isdigit():
            continue
        out.append("N" if token in ("INT+", "INT-") else token)
    return " ".join(out)


def overlap(splits: dict[str, Sequence[TextPair]]) -> dict[str, dict[str, float]]:
    """How much of dev and test the train split already holds: the same input text, the same
    function (its key: the fingerprint), and the same structure up to integers (skeleton) of
    the input and of the reference. The splits are made by function, so the first two are 0;
    the skeleton shares are the overlap that remains (a test f differing from a train f only in
    its constants)."""
    train = splits["train"]
    seen = {"input": {p.input_text for p in train}, "function": {p.key for p in train},
            "input_skeleton": {skeleton(p.input_text) for p in train},
            "target_skeleton": {skeleton(p.target) for p in train}}
    report = {}
    for split in ("dev", "test"):
        pairs = splits[split]
        if not pairs:
            continue
        found = {"input": [p.input_text for p in pairs], "function": [p.key for p in pairs],
                 "input_skeleton": [skeleton(p.input_text) for p in pairs],
                 "target_skeleton": [skeleton(p.target) for p in pairs]}
        report[split] = {kind: sum(item in seen[kind] for item in items) / len(pairs)
                         for kind, items in found.items()}
    return report


def make_splits(pairs: Sequence[TextPair],
                fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
                ) -> dict[str, list[TextPair]]:
    """The pairs by split, by a hash of their key (the input's :func:`fingerprint`): splits never
    share a function, however it is written."""
    from lmlab.tasks.builtin import hash_splits

    return hash_splits(pairs, lambda pair: pair.key, fractions)


# -- verification ---------------------------------------------------------------------------------
UNVERIFIABLE = ("timeout", "undecided")  # verdicts where the check could not decide
LOG_LIMIT = 10_000  # |values| over e^LOG_LIMIT overflow: never built (mpmath would make giant exponents)
DIGITS = (30, 60)  # every value at both precisions; a value they disagree on is unstable
EXTREME = 1e6  # |f| outside [1/EXTREME, EXTREME] at a point: add points over a wider range


@dataclass(frozen=True)
class Verdict:
    """Whether a predicted antiderivative is correct, and what decided: ``numeric``,
    ``simplify``, ``unparsable``, ``numeric-mismatch``, or, when the check could not decide
    (counted unverifiable, not correct), ``timeout`` or ``undecided``."""

    correct: bool
    method: str

    @property
    def unverifiable(self) -> bool:
        return self.method in UNVERIFIABLE


class _Undefined(ArithmeticError):
    """A value that is undefined (a division by zero, ``log 0``, sympy's ``zoo`` or ``nan``)."""


class _Overflow(_Undefined):
    """A value too large to build (beyond e^LOG_LIMIT), a function of a huge argument, or a
    node outside the vocabulary: not computed, so it decides nothing."""


UNDEFINED = "undefined"  # a value at a point where the expression has none


def _sample_points(count: int, seed: int, low: float = 0.1, high: float = 3.0,
                   log: bool = False) -> list[float]:
    """Real points in (low, high), uniform or log-uniform; (0.1, 3) by default: where ``log``
    and powers of ``x`` are real, so forms of the same function that differ by a branch
    elsewhere (``log(x**2)`` and ``2*log(x)``) agree."""
    rng = np.random.default_rng(seed)
    if log:
        return [float(np.exp(rng.uniform(np.log(low), np.log(high)))) for _ in range(count)]
    return [float(rng.uniform(low, high)) for _ in range(count)]


def _checked(value):
    import mpmath

    if mpmath.isnan(value) or mpmath.isinf(value):
        raise _Undefined(value)
    if value != 0 and mpmath.mag(value) > LOG_LIMIT * 1.45:
        raise _Overflow(value)
    return value


def _power(base, exponent, integer: bool):
    """``base ** exponent`` (principal branch, as sympy's), refused before it overflows."""
    import mpmath

    if base == 0:
        if integer and exponent > 0 or not integer and mpmath.re(exponent) > 0:
            return mpmath.mpf(0)
        raise _Undefined("0 to a non-positive power")
    if integer:
        if abs(float(mpmath.log(abs(base)))) * abs(int(exponent)) > LOG_LIMIT:
            raise _Overflow("power overflows")
        return mpmath.power(base, int(exponent))
    product = exponent * mpmath.log(base)
    if mpmath.re(product) > LOG_LIMIT:
        raise _Overflow("power overflows")
    return mpmath.exp(product)


def _function(name: str, arg):
    """A unary function of the prefix vocabulary, refused where it would overflow."""
    import mpmath

    if name in ("exp", "sinh", "cosh") and abs(mpmath.re(arg)) > LOG_LIMIT \
            and (name != "exp" or mpmath.re(arg) > 0):
        raise _Overflow(f"{name} overflows")
    if name in ("sin", "cos", "tan") and (abs(mpmath.im(arg)) > LOG_LIMIT
                                          or abs(mpmath.re(arg)) > 1e50):
        raise _Overflow(f"{name} of a huge argument")
    return getattr(mpmath, name)(arg)


def _value(expr, x):
    """``expr`` at ``x`` with mpmath at its current precision, node by node, so that no step
    can overflow (or hang building a huge number): :class:`_Undefined` instead."""
    import mpmath
    import sympy

    if expr.is_Symbol:
        return x
    if expr.is_Integer:
        return mpmath.mpf(int(expr))
    if expr.is_Rational:
        return mpmath.mpf(int(expr.p)) / int(expr.q)
    if expr.is_number and not expr.args:  # E, pi, I, a float; zoo, nan and oo are undefined
        try:
            return _checked(mpmath.mpmathify(expr.evalf(mpmath.mp.dps + 5)))
        except (TypeError, ValueError):
            raise _Undefined(str(expr)) from None
    args = [_value(arg, x) for arg in expr.args]
    try:
        if expr.is_Add:
            return _checked(mpmath.fsum(args))
        if expr.is_Mul:
            return _checked(mpmath.fprod(args))
        if expr.is_Pow:
            return _checked(_power(*args, expr.exp.is_Integer is True))
        name = type(expr).__name__
        if name not in FUNCTIONS:  # nothing of ours makes one; not a reason to fail a check
            raise _Overflow(f"no numeric value for {name}")
        return _checked(_function(name, args[0]))
    except (ZeroDivisionError, ValueError, OverflowError) as error:
        raise _Undefined(str(error)) from None
    except sympy.SympifyError as error:  # pragma: no cover - defensive
        raise _Undefined(str(error)) from None


def _values_at(point: float, exprs: Sequence[Any]) -> list[Any]:
    """Each of ``exprs`` at ``point`` at 60 digits; :data:`UNDEFINED` where it has no value;
    None where it overflows or differs between 30 and 60 digits (rounding decided it)."""
    return [_value_at(expr, point) for expr in exprs]


@functools.lru_cache(maxsize=4096)  # a beam's hypotheses share their f
def _value_at(expr: Any, point: float) -> Any:
    import mpmath

    try:
        found = []
        for digits in DIGITS:
            with mpmath.workdps(digits):
                found.append(_value(expr, mpmath.mpf(point)))
        with mpmath.workdps(DIGITS[-1]):
            low, high = found
            return high if abs(low - high) <= mpmath.mpf(1e-15) * abs(high) else None
    except _Overflow:
        return None
    except _Undefined:
        return UNDEFINED


def _compare(values: Sequence[Sequence[Any]], rtol: float, atol: float) -> tuple[int, int]:
    """Points where ``G'`` and ``f`` agree (decided by the relative part) and disagree, within
    ``rtol * |f| + atol * min |f|``: the absolute part scales with the smallest nonzero |f| over
    the points, so a tiny f is held to its own size, not to 1 (where f vanishes, values that
    rounding decided were already dropped as unstable). ``G'`` undefined where f has a value
    disagrees."""
    import mpmath

    numbers = [(f, g) for f, g in values if f is not None and f is not UNDEFINED]
    undefined = sum(g is UNDEFINED for _, g in numbers)
    pairs = [(f, g) for f, g in numbers if g is not None and g is not UNDEFINED]
    if not pairs:
        return 0, undefined
    with mpmath.workdps(DIGITS[-1]):
        floor = atol * min((abs(f) for f, _ in pairs if f != 0), default=mpmath.mpf(0))
        agree, disagree = 0, undefined
        for f, g in pairs:
            if abs(g - f) > rtol * abs(f) + floor:
                disagree += 1
            elif rtol * abs(f) >= floor:  # not passed by the floor alone
                agree += 1
    return agree, disagree


def _numeric_verdict(slope, target, points: int, rtol: float, atol: float, seed: int
                     ) -> Verdict:
    """``G' = f`` judged at points (more, over (1e-3, 10), where |f| is extreme or undefined
    somewhere), then by ``simplify`` where the points are mixed or too few decide."""
    import sympy

    values = [_values_at(point, (target, slope)) for point in _sample_points(points, seed)]
    if any(f is None or f is UNDEFINED or not 1 / EXTREME <= abs(f) <= EXTREME
           for f, _ in values):
        values += [_values_at(point, (target, slope))
                   for point in _sample_points(2 * points, seed + 1, 1e-3, 10.0, log=True)]
    agree, disagree = _compare(values, rtol, atol)
    if disagree and not agree:
        return Verdict(False, "numeric-mismatch")
    if agree >= 3 and not disagree:
        return Verdict(True, "numeric")
    try:
        if sympy.simplify(slope - target) == 0:
            return Verdict(True, "simplify")
    except TimeoutError:
        raise
    except Exception:  # noqa: BLE001 - sympy's simplify fails in many ways on odd input
        pass
    return Verdict(False, "numeric-mismatch" if disagree else "undecided")


def verify(prediction: Sequence[str] | str, derivative: Sequence[str] | str, points: int = 8,
           rtol: float = 1e-12, atol: float = 1e-20, timeout: float = 2.0, seed: int = 0
           ) -> Verdict:
    """Is ``prediction`` (prefix tokens, or their text) an antiderivative of ``derivative``?
    ``G' - f`` at ``points`` real points decides (within ``rtol * |f| + atol * min |f|``,
    at 30 and 60 digits), or where that is inconclusive ``simplify(G' - f) == 0``; parsing,
    differentiation, every evaluation and simplify all under ``timeout`` seconds in total.
    A hypothesis the check cannot decide is ``unverifiable``, not correct (docs/tasks.md)."""
    import sympy

    x = sympy.Symbol("x")
    target = from_prefix(derivative.split() if isinstance(derivative, str) else derivative)
    try:
        with time_limit(timeout):
            try:
                guess = from_prefix(prediction.split() if isinstance(prediction, str)
                                    else list(prediction))
            except (LmlabError, RecursionError, TypeError, ValueError, ZeroDivisionError,
                    MemoryError):
                return Verdict(False, "unparsable")
            return _numeric_verdict(sympy.diff(guess, x), target, points, rtol, atol, seed)
    except TimeoutError:
        return Verdict(False, "timeout")
    except RecursionError:
        return Verdict(False, "undecided")
