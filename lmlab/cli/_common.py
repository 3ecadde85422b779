"""Shared plumbing for CLI modules: the parser, command groups, examples in every --help."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

Handler = Callable[[argparse.Namespace], Any]


class CommandRegistry:
    """Lets each CLI module add top-level commands (``lmlab pretrain``) or commands inside a
    group shared by several modules (``lmlab data build`` and ``lmlab data tokenize``)."""

    def __init__(self, subparsers: argparse._SubParsersAction):
        self._subparsers = subparsers
        self._groups: dict[str, argparse._SubParsersAction] = {}

    def command(self, name: str, help: str, example: str, handler: Handler,
                group: str | None = None, description: str | None = None) -> argparse.ArgumentParser:
        """Add a command; ``example`` is shown under "example:" in its --help.

        Returns the command's parser so the caller can add arguments.
        """
        parent = self._subparsers if group is None else self.group(group)
        parser = parent.add_parser(
            name, help=help, description=description or help,
            epilog=f"example:\n  {example}", formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        parser.set_defaults(handler=handler)
        return parser

    def group(self, name: str, help: str | None = None) -> argparse._SubParsersAction:
        """The sub-command set of group ``name`` (created on first use)."""
        if name not in self._groups:
            parser = self._subparsers.add_parser(name, help=help or f"{name} commands",
                                                 description=help or f"{name} commands")
            parser.set_defaults(handler=lambda _args, p=parser: p.print_help())
            self._groups[name] = parser.add_subparsers(title="commands", metavar="COMMAND")
        return self._groups[name]


def build_parser() -> tuple[argparse.ArgumentParser, CommandRegistry]:
    from lmlab import __version__

    parser = argparse.ArgumentParser(
        prog="lmlab",
        description="Pretrain, fine-tune, probe and compress Transformer language models.",
        epilog="example:\n  lmlab data list\n\nEvery command's --help shows an example.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"lmlab {__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    return parser, CommandRegistry(subparsers)
