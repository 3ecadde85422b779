"""The decompilation run's table and plot: verified accuracy by program size and optimisation
level, one column per beam, from the JSON ``lmlab seq2seq evaluate --data DECOMPILE --out`` wrote
(docs/encoder-decoders.md, Katz et al.).

    python scripts/decompile_table.py eval-test.json --out docs-decompile/

Writes ``decompile.md`` (the table, and the verdicts of the greedy hypotheses: where it fails)
and ``decompile.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from lmlab.analysis.report import write_files
from lmlab.utils.errors import LmlabError


def cells(results: dict[str, Any]) -> tuple[list[int], dict[tuple[str, int], dict[int, Any]]]:
    """The beams, and (level, size) -> beam -> (verified share, examples); size 0 is the
    level's total."""
    beams = sorted(int(k.split()[1]) for k in results if k.startswith("beam "))
    if results.get("task") != "decompile" or not beams:
        raise LmlabError("not the evaluation of a decompile task folder",
                         "pass the JSON of lmlab seq2seq evaluate --data DECOMPILE --out FILE")
    table: dict[tuple[str, int], dict[int, Any]] = defaultdict(dict)
    for beam in beams:
        totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
        for tag, scores in results[f"beam {beam}"]["by_tag"].items():
            level, size = re.fullmatch(r"(O\d) size (\d+)", tag).groups()
            table[level, int(size)][beam] = (scores["verified_accuracy"], scores["examples"])
            totals[level][0] += scores["verified_accuracy"] * scores["examples"]
            totals[level][1] += scores["examples"]
        for level, (solved, count) in totals.items():
            table[level, 0][beam] = (solved / count, count)
    return beams, dict(table)


def markdown(results: dict[str, Any]) -> str:
    """The table (greedy = beam 1) and the greedy verdicts."""
    beams, table = cells(results)
    names = ["greedy" if b == 1 else f"beam {b}" for b in beams]
    lines = ["| level | size (statements) | examples | " + " | ".join(names) + " |",
             "|---|---:|---:|" + "---:|" * len(beams)]
    for level, size in sorted(table, key=lambda k: (k[0], k[1] == 0, k[1])):
        row = table[level, size]
        label = "**all**" if size == 0 else str(size)
        shares = " | ".join(f"{row[b][0]:.1%}" for b in beams)
        lines.append(f"| {level} | {label} | {row[beams[0]][1]} | {shares} |")
    if 1 in beams:
        verdicts = results["beam 1"]["verdicts"]
        total = sum(verdicts.values())
        lines += ["", "Greedy hypotheses by verdict: " + ", ".join(
            f"{name} {count} ({count / total:.1%})" for name, count in
            sorted(verdicts.items(), key=lambda item: -item[1]))]
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: Path) -> None:
    """Verified accuracy against size, one line per level and beam."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    beams, table = cells(results)
    fig, ax = plt.subplots(figsize=(6, 4))
    for level in sorted({level for level, _ in table}):
        sizes = sorted(s for lv, s in table if lv == level and s)
        for beam in beams:
            ax.plot(sizes, [100 * table[level, s][beam][0] for s in sizes], marker="o",
                    linestyle="-" if beam == 1 else "--",
                    label=f"-{level}, {'greedy' if beam == 1 else f'beam {beam}'}")
    ax.set_xlabel("function size (statements)")
    ax.set_ylabel("verified accuracy (%)")
    ax.set_title("Assembly -> C, verified by compiling and running")
    ax.set_xticks(sorted({s for _, s in table if s}))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="JSON written by lmlab seq2seq evaluate --out")
    parser.add_argument("--out", required=True, help="folder for decompile.md and .png")
    args = parser.parse_args(argv)
    results = json.loads(Path(args.results).read_text())
    cells(results)  # refused before anything is written
    write_files(args.out, {"decompile.md": markdown(results),
                           "decompile.png": lambda path: plot(results, path)})
    print(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
