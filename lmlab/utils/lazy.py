"""Lazy ``"module:attribute"`` references: the registries (heads, model families, objectives,
pipelines) and the package's top-level names list where a thing lives, and import it on first
use, so what a lookup returns never depends on what the caller happened to import before."""

from __future__ import annotations

import importlib
from typing import Any


def import_attribute(target: str) -> Any:
    """The object ``"module:attribute"`` names, importing the module."""
    module_name, attribute = target.split(":")
    return getattr(importlib.import_module(module_name), attribute)


def resolve_entry(table: dict[str, Any], key: str) -> Any:
    """``table[key]``; a ``"module:attribute"`` string is imported and replaced by what it
    names (imported once). The caller checks that ``key`` is in the table."""
    entry = table[key]
    if isinstance(entry, str):
        entry = table[key] = import_attribute(entry)
    return entry
