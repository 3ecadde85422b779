"""The CLI's shape: every command lists and every command's --help shows an example."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lmlab.cli import _register_all, main
from lmlab.cli._common import build_parser


def _all_command_parsers():
    parser, registry = build_parser()
    _register_all(registry)
    found = []

    def walk(p, path):
        for action in p._actions:
            if action.__class__.__name__ == "_SubParsersAction":
                for name, sub in action.choices.items():
                    walk(sub, path + [name])
        if path:
            found.append((path, p))

    walk(parser, [])
    return found


def test_top_level_help_lists_commands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "commands" in out


def test_every_leaf_command_has_an_example():
    leaves = [(path, p) for path, p in _all_command_parsers() if p.epilog is not None or
              not any(a.__class__.__name__ == "_SubParsersAction" for a in p._actions)]
    assert leaves, "no commands registered"
    for path, p in leaves:
        if any(a.__class__.__name__ == "_SubParsersAction" for a in p._actions):
            continue
        assert p.epilog and "example:" in p.epilog, f"`lmlab {' '.join(path)} --help` has no example"
        assert "lmlab " in p.epilog, f"`lmlab {' '.join(path)}` example does not show a command"


def test_console_script_runs():
    result = subprocess.run([sys.executable, "-m", "lmlab.cli", "--version"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0
    assert "lmlab" in result.stdout


def test_import_is_light():
    code = "import sys, lmlab; assert 'torch' not in sys.modules, 'import lmlab pulled torch'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
