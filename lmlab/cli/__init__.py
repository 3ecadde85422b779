"""The ``lmlab`` command line.

Every module in this package (except those starting with ``_``) defines
``register(commands: CommandRegistry)`` and adds its subcommands there; modules are found
automatically, so adding a command means adding one module. Handlers import heavy libraries
(torch, transformers-free model code) lazily so that ``lmlab --help`` stays fast.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

from lmlab.cli._common import CommandRegistry, build_parser


def _register_all(registry: CommandRegistry) -> None:
    package = sys.modules[__name__]
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        module.register(registry)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``lmlab`` console script."""
    from lmlab.utils.errors import LmlabError

    parser, registry = build_parser()
    _register_all(registry)
    try:
        args = parser.parse_args(argv)  # a flag's type may refuse a value with an LmlabError
        if getattr(args, "handler", None) is None:
            parser.print_help()
            return 0
        result = args.handler(args)
    except LmlabError as error:
        print(f"lmlab: error: {error.problem}", file=sys.stderr)
        if error.fix:
            print(f"lmlab: fix: {error.fix}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("lmlab: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
