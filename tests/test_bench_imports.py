"""Every name a benchmark imports from lmlab still exists: the benchmarks run by hand, so a
rename in the library would otherwise break them unnoticed (imports inside functions count)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def lmlab_imports(path: Path) -> list[tuple[str, str | None]]:
    """(module, name) for every ``from lmlab... import name`` and (module, None) for every
    ``import lmlab...`` anywhere in the file."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "lmlab":
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names
                      if alias.name.split(".")[0] == "lmlab"]
    return found


@pytest.mark.parametrize("path", sorted(BENCH.glob("*.py")), ids=lambda p: p.name)
def test_bench_imports_exist(path):
    for module_name, name in lmlab_imports(path):
        module = importlib.import_module(module_name)
        if name is not None and not hasattr(module, name):
            importlib.import_module(f"{module_name}.{name}")  # a submodule, or ImportError


def test_the_check_sees_a_missing_name(tmp_path):
    script = tmp_path / "bench_x.py"
    script.write_text("def main():\n    from lmlab.models.inputs import no_such_name\n")
    assert lmlab_imports(script) == [("lmlab.models.inputs", "no_such_name")]
    with pytest.raises(ImportError):
        test_bench_imports_exist(script)
