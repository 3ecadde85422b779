"""The suite's float comparisons hold on any x86-64 CPU (issue #29). Two computations of the same
values (another batch position or batch size, another kernel, ours and transformers) agree up to
rounding, which differs between AVX2, AVX-512 and AMX hosts; so they are compared with
conftest.assert_close_rounding, whose tolerance follows from dtype, terms, depth and scale. This
test reads every test file and refuses a comparison that sets its own tolerance: torch/numpy
allclose, isclose and assert_close with a literal or default tolerance, or pytest.approx /
math.isclose with a literal one, unless its statement says why (`# tol: <reason>`, e.g. a
sampling rate or a value printed to 4 digits; `# exact: <reason>` for zero tolerance on one
computation). Checks that values differ (`not`, `!=`) need no reason. A float torch.equal is
refused when it runs (conftest's _float_equality_says_why): these tests show that both rules
catch the two comparisons that failed on an AVX2 host without VNNI."""

from __future__ import annotations

import ast
import linecache
from pathlib import Path

import pytest
import torch
from conftest import TESTS_DIR, call_sites, has_marker

CLOSENESS = {"allclose", "isclose", "assert_close", "assert_allclose",
             "assert_array_almost_equal", "assert_almost_equal"}
SCALAR = {"pytest.approx", "approx", "math.isclose"}  # default tolerance: float64 rounding
TOLERANCES = {"atol", "rtol", "abs", "rel", "abs_tol", "rel_tol", "decimal"}
FLOAT64_ROUNDING = 1e-9  # a literal tolerance this small no float32 computation passes


def _name(node: ast.AST) -> str:
    """``torch.testing.assert_close`` for that call's function, "" for anything else."""
    if isinstance(node, ast.Attribute):
        base = _name(node.value)
        return f"{base}.{node.attr}" if base else ""
    return node.id if isinstance(node, ast.Name) else ""


def _literal(node: ast.AST, constants: dict[str, ast.AST]) -> float | None:
    """The value of a number written in the source (``1e-5``, ``-2 ** -10``, a local name bound
    once to one), None for a computed tolerance."""
    if isinstance(node, ast.Name) and node.id in constants:
        node = constants[node.id]
    numeric = (ast.Constant, ast.UnaryOp, ast.BinOp, ast.operator, ast.unaryop, ast.Expression)
    if all(isinstance(part, numeric) for part in ast.walk(node)):
        try:
            return float(eval(compile(ast.Expression(node), "<tolerance>", "eval")))
        except (TypeError, ValueError, ArithmeticError):
            return None
    return None


def _constants(tree: ast.AST) -> dict[ast.AST, dict[str, ast.AST]]:
    """For each function, its names bound exactly once (``atol = 1e-5``) -> the bound value."""
    scopes = {}
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef | ast.Module):
            bound: dict[str, list[ast.AST]] = {}
            for node in ast.walk(function):
                if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                        and isinstance(node.targets[0], ast.Name):
                    bound.setdefault(node.targets[0].id, []).append(node.value)
            scopes[function] = {k: v[0] for k, v in bound.items() if len(v) == 1}
    return scopes


def _tensor_value(node: ast.AST) -> bool:
    """Whether ``node`` reads a value out of a tensor or array (``.item()``, ``.tolist()``,
    ``float(...)``): a computed float, not a known constant."""
    return any(isinstance(n, ast.Call) and (_name(n.func) == "float" or (
        isinstance(n.func, ast.Attribute) and n.func.attr in ("item", "tolist", "numpy")))
        for n in ast.walk(node))


def _abs_of_difference(node: ast.AST) -> ast.Call | None:
    """The ``abs(a - b)`` / ``(a - b).abs()`` call in ``node``, if any."""
    for n in ast.walk(node):
        called = getattr(n, "func", None)
        if isinstance(n, ast.Call) and getattr(called, "attr", getattr(called, "id", "")) in (
                "abs", "fabs"):
            operand = n.args[0] if n.args else getattr(n.func, "value", None)
            if isinstance(operand, ast.BinOp) and isinstance(operand.op, ast.Sub):
                return n
    return None


def loose_comparisons(filename: str) -> list[str]:
    """``file:line: what`` for each float comparison in ``filename`` that sets its own tolerance
    without a reason (module docstring); ``abs(a - b) < 1e-5`` counts as one."""
    tree = ast.parse("".join(linecache.getlines(filename)))
    scopes, sites, found = _constants(tree), call_sites(filename), []

    def flag(call: ast.Call, what: str) -> None:
        negated, first, last = sites[(call.lineno, call.end_lineno, call.col_offset,
                                      call.end_col_offset)]
        if not negated and not has_marker(filename, first, last):
            found.append(f"{Path(filename).name}:{call.lineno}: {what}")

    def check_call(call: ast.Call, constants: dict, compare: ast.Compare | None) -> None:
        name = _name(call.func)
        scalar = name in SCALAR
        if not scalar and name.rsplit(".", 1)[-1] not in CLOSENESS:
            return
        given = [k.value for k in call.keywords if k.arg in TOLERANCES]
        given += call.args[1 if name.endswith("approx") else 2:]  # positional tolerances
        values = [_literal(node, constants) for node in given]
        written = [value for value in values if value is not None]
        if len(written) < len(values) and max(written, default=0) <= FLOAT64_ROUNDING:
            return  # a tolerance computed here (from conftest.rounding_tolerance, a bound)
        if scalar and not values and not _tensor_value(compare or call):
            return  # pytest.approx's default: the float64 rounding of a known constant
        if not written or max(written) == 0 or max(written) > FLOAT64_ROUNDING:
            flag(call, name)

    def visit(node: ast.AST, constants: dict, compare: ast.Compare | None) -> None:
        constants = {**constants, **scopes.get(node, {})}  # a function sees the module's
        if isinstance(node, ast.Compare):
            compare = node
            bound = _literal(node.comparators[-1], constants)
            difference = _abs_of_difference(node.left)
            if all(isinstance(op, ast.Lt | ast.LtE) for op in node.ops) and difference \
                    and bound is not None and bound > FLOAT64_ROUNDING:
                flag(difference, "abs(a - b) < a literal")
        if isinstance(node, ast.Call):
            check_call(node, constants, compare)
        for child in ast.iter_child_nodes(node):
            visit(child, constants, compare)

    visit(tree, {}, None)
    return found


def _check_snippet(source: str, tmp_name: str) -> list[str]:
    """:func:`loose_comparisons` of ``source`` as if it were a test file."""
    filename = str(Path(TESTS_DIR) / tmp_name)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    try:
        return loose_comparisons(filename)
    finally:
        del linecache.cache[filename]
        call_sites.cache_clear()


@pytest.mark.parametrize("path", sorted(Path(TESTS_DIR).glob("*.py")), ids=lambda p: p.name)
def test_float_comparisons_take_their_tolerance_from_the_helper(path):
    assert loose_comparisons(str(path)) == [], (
        "compare two computations with conftest.assert_close_rounding (terms, depth, scale of "
        "the computation), or say why this tolerance on the statement: `# tol: <reason>`")


def test_the_lint_flags_fixed_tolerances_and_accepts_reasons():
    source = (
        "import math, numpy as np, pytest, torch\n"
        "from conftest import rounding_tolerance\n"
        "def test_x(a, b, loss):\n"
        "    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)\n"                 # 4 flagged
        "    assert torch.allclose(a, b)\n"                                         # 5 flagged
        "    np.testing.assert_allclose(a, b, 1e-4)\n"                              # 6 flagged
        "    assert loss.item() == pytest.approx(2.5, rel=1e-5)\n"                  # 7 flagged
        "    tol = 1e-6\n"
        "    assert math.isclose(a, b, abs_tol=tol)\n"                              # 9 flagged
        "    torch.testing.assert_close(a, b, atol=0, rtol=0)\n"                    # 10 flagged
        "    assert loss.item() == pytest.approx(2.5)\n"                            # 11 flagged
        "    assert abs(float(loss) - 2.5) < 1e-6\n"                                # 12 flagged
        "    assert (a - b).abs().max().item() <= 1e-5\n"                           # 13 flagged
        "    assert a == pytest.approx(0.15, abs=0.02)  # tol:\n"                   # 14 flagged
        "    assert not torch.allclose(a, b)\n"
        "    assert loss != pytest.approx(2.5, rel=1e-3)\n"
        "    assert a == pytest.approx(0.15, abs=0.02)  # tol: a sampling rate\n"
        "    torch.testing.assert_close(a, b, atol=0, rtol=0)  # exact: one computation\n"
        "    torch.testing.assert_close(a, b, atol=rounding_tolerance(terms=8), rtol=0)\n"
        "    assert a == pytest.approx(b) and a == pytest.approx(b, rel=1e-12)\n"
        "    assert abs(a - b) < 1e-12 and abs(a - b) < 3 * tol and abs(a - b) > 0.5\n"
        "    # tol: a reason in the comment lines above,\n"
        "    # which may take two\n"
        "    np.testing.assert_allclose(a, b,\n"
        "                               rtol=1e-3)\n"
        "    torch.testing.assert_close(a, b, atol=tol * 3, rtol=1e-5)\n"           # 26 flagged
        "    np.testing.assert_allclose(a, b, atol=ATOL)\n"                         # 27 flagged
        "ATOL = 1e-4\n")
    flagged = [int(line.split(":")[1]) for line in _check_snippet(source, "test_snippet.py")]
    assert flagged == [4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 26, 27]


def _run_as_test_file(source: str, name: str, folder: str = TESTS_DIR) -> None:
    """Run ``source`` as if it were the file ``folder/name`` (a test file by default), with
    torch.equal as conftest's fixture makes it for the tests."""
    filename = str(Path(folder) / name)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    try:
        exec(compile(source, filename, "exec"), {"torch": torch, "__name__": "snippet"})
    finally:
        del linecache.cache[filename]
        call_sites.cache_clear()


OLD_ELMO = '''
tokens = torch.randn(5, 16)  # (T, P): test_elmo's token vectors before #29
assert torch.equal(tokens[0], tokens[3]) or True
'''
OLD_CONCAT = '''
vectors, expected = torch.randn(4, 80), torch.randn(4, 80)  # encode(batch_size=3), encode()
assert torch.equal(vectors, expected) or True
'''


@pytest.mark.parametrize("source", [OLD_ELMO, OLD_CONCAT], ids=["elmo", "concat"])
def test_a_float_torch_equal_without_a_reason_is_refused(source):
    """The two comparisons that failed on the AVX2 host, as they were written: refused on every
    host, even where the kernels happen to round both sides alike."""
    with pytest.raises(AssertionError, match="torch.equal on float tensors.*assert_close_rounding"):
        _run_as_test_file(source, "test_old_snippet.py")


def test_reasons_integers_and_differences_pass_the_equality_check():
    source = (
        "x = torch.randn(3, 4)\n"
        "assert torch.equal(x[1], x.clone()[1])  # exact: a copy\n"
        "assert not torch.equal(x[0], x[1])\n"
        "assert torch.equal(torch.arange(3), torch.arange(3))\n"
        "assert all(torch.equal(a, b)\n"
        "           for a, b in zip(x, x.clone()))  # exact: copies, a statement on two lines\n")
    _run_as_test_file(source, "test_snippet.py")
    with pytest.raises(AssertionError, match="test_snippet.py:2: torch.equal"):
        _run_as_test_file("x = torch.randn(3)\nassert torch.equal(x, x)  # exact:\n",
                          "test_snippet.py")
    # the library's own calls (frames outside tests/) are not the tests' comparisons
    _run_as_test_file("x = torch.randn(3)\nassert torch.equal(x, x + 0)\n", "module.py",
                      str(Path(TESTS_DIR).parent / "lmlab"))
