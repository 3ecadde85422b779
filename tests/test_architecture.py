"""The house rules of docs/architecture.md, checked on the code's own imports.

The import contract (`.importlinter`, import-linter's layers contract) keeps every package on
its floor; these tests run it, check that no two files import each other in a cycle (imports
inside functions count, ``TYPE_CHECKING`` ones do not), that no module imports the top-level
``lmlab`` package, that the floors the docs show are the contract's, and that no function grows
past 100 lines.
"""

from __future__ import annotations

import ast
import configparser
import re
import subprocess
import sys
from pathlib import Path

import grimp
import networkx
import pytest

ROOT = Path(__file__).resolve().parent.parent
CONTRACT = ROOT / ".importlinter"
DOC = ROOT / "docs" / "architecture.md"


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("lmlab", exclude_type_checking_imports=True)


def contract_floors() -> list[list[str]]:
    """The contract's layers, top floor first, each a list of packages."""
    parser = configparser.ConfigParser()
    parser.read(CONTRACT)
    layers = parser["importlinter:contract:floors"]["layers"].split("\n")
    return [sorted(p.strip() for p in line.split("|")) for line in layers if line.strip()]


def doc_floors() -> list[list[str]]:
    """The floors table of docs/architecture.md (``| 13 | `cli` | ...``), top floor first."""
    rows = re.findall(r"^\| *(\d+) *\| *([^|]+)\|", DOC.read_text(encoding="utf-8"), re.M)
    by_floor = {int(floor): sorted(re.findall(r"`([a-z_]+)`", cells)) for floor, cells in rows}
    assert sorted(by_floor) == list(range(len(by_floor))), "floors numbered 0, 1, 2, ..."
    return [by_floor[floor] for floor in sorted(by_floor, reverse=True)]


def test_the_import_contract_holds():
    result = subprocess.run([str(Path(sys.executable).parent / "lint-imports"), "--config",
                             str(CONTRACT)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_the_docs_show_the_contracts_floors():
    assert doc_floors() == contract_floors()


def test_every_package_has_a_floor():
    """The contract is exhaustive (import-linter refuses an unlisted package); this says which."""
    listed = {p for floor in contract_floors() for p in floor}
    packages = {p.stem for p in (ROOT / "lmlab").iterdir()
                if (p / "__init__.py").is_file() or (p.suffix == ".py" and p.stem != "__init__")}
    assert packages - {"__main__"} == listed


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (networkx comes with torch)."""
    graph = networkx.DiGraph([(a, b) for a, targets in edges.items() for b in targets])
    return sorted(sorted(c) for c in networkx.strongly_connected_components(graph) if len(c) > 1)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_two_files_import_each_other_in_a_cycle(graph):
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    assert _cycles(edges) == []


def test_no_module_imports_the_top_level_package(graph):
    """``lmlab/__init__.py`` re-exports the public API from above every floor."""
    importers = sorted(m for m in graph.find_modules_that_directly_import("lmlab")
                       if m != "lmlab.__main__")
    assert importers == []


def test_no_function_is_longer_than_100_lines():
    long = []
    for path in sorted((ROOT / "lmlab").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > 100:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length})")
    assert long == []
