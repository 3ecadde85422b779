"""``lmlab models list``: the offline checkpoints on this machine, their size and location."""

from __future__ import annotations

import argparse

from lmlab.cli import _common


def register(commands) -> None:
    p = commands.command(
        "list", help="the offline checkpoints (short name, kind, size, where they are); a short "
                     "name works wherever a model path does",
        example="lmlab models list", handler=_list, group="models")
    _common.add_flag(p, "json", help="print the rows as JSON")


def _list(args: argparse.Namespace) -> int:
    import json

    from lmlab.utils.catalog import list_models

    rows = list_models()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = [("name", "kind", "size", "path")]
    for row in rows:
        size = f"{row['bytes'] / 1e6:.1f} MB" if row["installed"] else "-"
        where = row["path"] if row["installed"] else f"not installed: {row['install']}"
        table.append((row["name"], row["kind"], size, where))
    _common.print_table(table)
    print("\nUse the short name as a model path, e.g. `lmlab generate smollm2 \"Hello\"` or "
          "`lmlab.from_pretrained(\"minilm\")`.")
    return 0
