"""Small checks that API entry points run on their arguments before any work.

Each raises :class:`LmlabError` naming the option and the bad value, with the fix. They are
torch-free so that a command refuses bad input in the time Python takes to start. ``option``
is the name a person typed (``--batch-size``); the library functions that call these pass
the same name, so the CLI and the API raise the same error for the same value.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from lmlab.utils.errors import LmlabError


def parse_int_list(text: str, option: str, example: str = "0,1,2") -> tuple[int, ...]:
    """Comma-separated integers (``"0,1,2"`` -> ``(0, 1, 2)``); at least one, none repeated."""
    parts = [part.strip() for part in str(text).split(",") if part.strip()]
    try:
        values = tuple(int(part) for part in parts)
    except ValueError:
        raise LmlabError(f"{option} {text!r} is not a list of whole numbers",
                         f"write comma-separated integers, e.g. {option} {example}") from None
    if not values:
        raise LmlabError(f"{option} {text!r} names no number",
                         f"write comma-separated integers, e.g. {option} {example}")
    if len(set(values)) != len(values):
        raise LmlabError(f"{option} {text!r} repeats a value", "list each value once")
    return values


def _check_number(value: object, option: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise LmlabError(f"{option} must be a number, got {value!r}",
                         f"give {option} a number (in YAML: 1.0e-3, not 1e-3)")
    if not math.isfinite(value):  # nan passes every comparison
        raise LmlabError(f"{option} must be a finite number, got {value}",
                         f"give {option} a finite number")


def check_at_least(value: float | None, minimum: float, option: str,
                   fix: str | None = None) -> None:
    """``value >= minimum`` (``None`` means "not given" and passes); ``fix``: advice more
    specific than "give it ``minimum`` or more"."""
    if value is None:
        return
    _check_number(value, option)
    if value < minimum:
        raise LmlabError(f"{option} must be at least {minimum:g}, got {value:g}",
                         fix or f"give {option} {minimum:g} or more")


def check_positive(value: float | None, option: str, fix: str | None = None) -> None:
    """``value > 0`` (``None`` passes); ``fix`` as :func:`check_at_least`'s."""
    if value is None:
        return
    _check_number(value, option)
    if not value > 0:
        raise LmlabError(f"{option} must be positive, got {value:g}",
                         fix or f"give {option} a number greater than 0")


def check_names(names: list[str] | tuple[str, ...], known: list[str] | tuple[str, ...],
                option: str, what: str) -> None:
    """Every one of ``names`` is in ``known`` (the registry of ``what``)."""
    unknown = [name for name in names if name not in known]
    if unknown:
        raise LmlabError(f"{option}: unknown {what} {', '.join(repr(n) for n in unknown)}",
                         f"use one of: {', '.join(known)}")


def check_choice(value: str, known: list[str] | tuple[str, ...] | dict, option: str,
                 what: str) -> str:
    """``value`` is one of ``known`` (a registry's names, or its keys); returns ``value``."""
    check_names([value], list(known), option, what)
    return value


def check_file(path: str | Path, option: str, fix: str) -> Path:
    """``path`` is an existing, readable file."""
    path = Path(path)
    if not path.exists():
        raise LmlabError(f"{option} {path} does not exist", fix)
    if not path.is_file():
        raise LmlabError(f"{option} {path} is a folder, not a file", fix)
    try:
        with open(path, "rb") as handle:
            handle.read(1)
    except OSError as error:
        raise LmlabError(f"{option} {path} cannot be read ({error.strerror})", fix) from None
    return path


def check_folder(path: str | Path, option: str, fix: str, holds: str | None = None,
                 what: str = "folder") -> Path:
    """``path`` is an existing folder (holding the file ``holds``, when given: what makes it
    the right kind of folder, e.g. ``manifest.json`` for token shards)."""
    path = Path(path)
    if not path.exists():
        raise LmlabError(f"{option} {path} does not exist", fix)
    if not path.is_dir():
        raise LmlabError(f"{option} {path} is a file, not a {what}", fix)
    if holds is not None and not (path / holds).is_file():
        raise LmlabError(f"{option} {path} is not a {what} (it has no {holds})", fix)
    return path


def check_output_file(path: str | Path, overwrite: bool, option: str = "--out") -> Path:
    """Refuse to replace an existing file without ``overwrite`` (and a folder in any case)."""
    path = Path(path)
    if path.is_dir():
        raise LmlabError(f"{option} {path} is a folder", f"give {option} a file name")
    if path.exists() and not overwrite:
        raise LmlabError(f"{option} {path} already exists",
                         "choose another file name, or pass --overwrite to replace it")
    return path


def check_output_folder(path: str | Path, overwrite: bool, what: str,
                        ignore: tuple[str, ...] = (), option: str = "--out") -> None:
    """Refuse, before any work, to write ``what`` into a folder that already holds something.

    ``ignore`` lists glob patterns of the writer's own leftovers (temporary files of a killed
    run), which do not count. With ``overwrite`` the folder is used as it is: the writer
    replaces its own files and leaves other files alone. ``option`` names the folder's flag.
    """
    import fnmatch

    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise LmlabError(f"{option} {folder} is a file, not a folder",
                         "give the path of a new (or empty) folder")
    if overwrite or not folder.is_dir():
        return
    held = sorted(p.name for p in folder.iterdir()
                  if not any(fnmatch.fnmatch(p.name, pattern) for pattern in ignore))
    if held:
        shown = ", ".join(held[:4]) + (f" and {len(held) - 4} more" if len(held) > 4 else "")
        raise LmlabError(f"{folder} already holds {shown}; the {what} would be written over it",
                         f"choose a new or empty {option} folder, or pass --overwrite to "
                         "replace what is there")


def refuse_adapted_checkpoint(model: Any) -> None:
    """Refuse (before anything is written) to save an adapted model as a plain checkpoint:
    its LoRA, adapters or virtual tokens are no base tensor and would be dropped or unreadable.
    BitFit changes base tensors only and saves as any model."""
    record = getattr(model, "adaptation", None)
    if record is not None and record.method != "bitfit":
        raise LmlabError(f"the model carries a {record.method} adaptation, which a plain "
                         "checkpoint does not hold", "save it with lmlab.adapt.save_adapter, "
                         "or merge it first (lmlab.adapt.merge: LoRA)")
