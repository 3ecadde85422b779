"""Writing a pruning or factorisation run: ``results.json``, ``results.md``, the curve's PNG
and the compressed model (with its tokenizer), into one output folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmlab.utils.io import atomic_write_json, atomic_write_text


def write_run(out: str | Path, results: dict[str, Any], table: list[dict[str, Any]],
              columns: list[tuple[str, str]], model=None, tokenizer=None,
              curve: dict[str, str] | None = None) -> list[Path]:
    """Write ``results`` (JSON), a Markdown table of ``table`` rows (``columns``: key, header)
    and, when given, the curve (``curve``: x key, x label, y label, title) and the model."""
    from lmlab.compress.heads import plot_curve
    from lmlab.interop.native import save_model

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "results.json", out / "results.md"]
    atomic_write_json(written[0], results)
    lines = [f"# {results.get('title', 'compression')}", "",
             f"model: `{results.get('model')}`; host: {results.get('host', '')}", "",
             "| " + " | ".join(h for _, h in columns) + " |",
             "|" + "---:|" * len(columns)]
    for row in table:
        lines.append("| " + " | ".join(_cell(row.get(k)) for k, _ in columns) + " |")
    atomic_write_text(written[1], "\n".join(lines) + "\n")
    if curve is not None and len(table) > 1:
        written.append(out / "curve.png")
        plot_curve(table, curve["x"], written[-1], curve["xlabel"], curve["ylabel"],
                   curve["title"])
    if model is not None:
        folder, kind = save_model(model, out / "model")
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
        results["model_format"] = kind
        atomic_write_json(written[0], results)
        written.append(folder)
    return written


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    return "" if value is None else str(value)
