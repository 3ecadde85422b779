"""Every ``--help`` is useful as written: commands and groups show a runnable-looking example
of themselves, and ``lmlab pretrain --help`` lists what its registries accept."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

from lmlab.cli import _register_all
from lmlab.cli._common import build_parser


def _walk() -> list[tuple[list[str], argparse.ArgumentParser]]:
    """(command path, parser) for every command and every group, found by walking the parser."""
    parser, registry = build_parser()
    _register_all(registry)
    found = []

    def walk(p: argparse.ArgumentParser, path: list[str]) -> None:
        found.append((path, p))
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, path + [name])

    walk(parser, [])
    return found


def _examples(help_text: str) -> list[str]:
    """The lines under "example:" of a rendered --help."""
    _, _, tail = help_text.partition("\nexample:\n")
    lines = []
    for line in tail.splitlines():
        if not line.startswith("  "):
            break
        lines.append(line.strip())
    return lines


def test_every_command_and_group_help_has_an_example_of_itself():
    parsers = _walk()
    groups = [path for path, p in parsers
              if any(isinstance(a, argparse._SubParsersAction) for a in p._actions) and path]
    assert {"data", "cost", "tokenizer", "tasks", "runs", "models"} <= {g[0] for g in groups}
    for path, p in parsers:
        examples = _examples(p.format_help())
        assert examples, f"`lmlab {' '.join(path)} --help` has no example: section"
        for example in examples:
            # a group's examples are its own commands; a command's example runs that command
            assert example.startswith(" ".join(["lmlab", *path])), (
                f"`lmlab {' '.join(path)} --help` shows an example of another command: {example}")


def test_group_help_lists_the_examples_of_its_commands():
    parsers = dict((tuple(path), p) for path, p in _walk())
    data_examples = _examples(parsers[("data",)].format_help())
    for command in ("list", "build", "tokenize"):
        own = _examples(parsers[("data", command)].format_help())
        assert own[0] in data_examples


def test_pretrain_help_names_every_registered_objective_family_and_size():
    from lmlab.models.families import KNOWN_FAMILIES
    from lmlab.models.presets import list_presets
    from lmlab.objectives.registry import available_objectives

    result = subprocess.run([sys.executable, "-m", "lmlab.cli", "pretrain", "--help"],
                            capture_output=True, text=True, check=True)
    words = set(re.findall(r"[\w.-]+", result.stdout))
    missing = [name for name in available_objectives() if name not in words]
    assert not missing, f"objectives not in `lmlab pretrain --help`: {missing}"
    families = {family for family, _ in list_presets()} | set(KNOWN_FAMILIES)
    assert not [f for f in families if f not in words], "a family is missing from --help"
    sizes = {size for _, size in list_presets()}
    assert not [s for s in sizes if s not in words], "a preset size is missing from --help"


def test_group_without_command_prints_its_help_with_examples():
    result = subprocess.run([sys.executable, "-m", "lmlab.cli", "cost"],
                            capture_output=True, text=True, check=True)
    assert "example:\n  lmlab cost estimate" in result.stdout


def test_help_does_not_load_torch():
    """``lmlab --help`` and a command's ``--help`` answer without importing torch (seconds on a
    cold disk): every CLI module, family spec and registry listing defers it."""
    code = ("import sys\nfrom lmlab.cli import main\n"
            "for argv in (['--help'], ['pretrain', '--help'], ['seq2seq', 'train', '--help']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip().splitlines()[-1] == "False"
