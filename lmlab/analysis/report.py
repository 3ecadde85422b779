"""What the analyses write: PNG figures (matplotlib's Agg backend: no display needed), pages
and reports from jinja2 templates, and folders of result files, each file written atomically.
The plot helpers and the template loader are training.report's (one of each)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from lmlab.training.report import pyplot, save_png  # noqa: F401 - the one plot helper
from lmlab.training.report import template as package_template
from lmlab.utils.io import atomic_write_json, atomic_write_text


def template(name: str) -> Any:
    """The jinja2 template ``name`` of this package (``probing_report.md.j2``,
    ``attention_view.html``), rendered verbatim (the callers escape what needs it)."""
    return package_template("lmlab.analysis", name)


def write_files(out: str | Path, files: dict[str, str | dict | Callable[[Path], Any]]
                ) -> list[Path]:
    """Write ``files`` into folder ``out`` (made if missing): name -> text, a JSON-ready dict,
    or a function writing the file at the path it is given (a plot). Returns the paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        if callable(content):
            content(out / name)
        elif isinstance(content, str):
            atomic_write_text(out / name, content)
        else:
            atomic_write_json(out / name, content)
    return [out / name for name in files]
