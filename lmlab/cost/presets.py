"""The model sizes ``lmlab cost estimate --model`` knows: every preset of
:mod:`lmlab.models.presets`, named ``<family>-<size>`` (``bert-base``, ``gpt2-small``,
``llama-smollm2-135m``), plus the short names people use for the released models
(``distilbert``, ``smollm2-135m``). The shapes are the family specs' (one source of truth)."""

from __future__ import annotations

from lmlab.utils.errors import LmlabError

# short names of released models -> (family, size)
_SHORT_NAMES = {"distilbert": ("distilbert", "base"), "smollm2-135m": ("llama", "smollm2-135m")}


def _table() -> dict[str, tuple[str, str]]:
    from lmlab.models.presets import list_presets

    table = {f"{family}-{size}": (family, size) for family, size in list_presets()}
    table.update(_SHORT_NAMES)
    return table


def preset_names() -> list[str]:
    """Names accepted by :func:`preset_config` (and ``lmlab cost estimate --model``)."""
    return list(_table())


def preset_config(name: str):
    """The :class:`~lmlab.models.config.TransformerConfig` of a named model size.

    Raises:
        LmlabError: for an unknown name (the message lists the known ones).
    """
    from lmlab.models.presets import preset

    table = _table()
    key = name.strip().lower()
    if key not in table:
        raise LmlabError(f"unknown model size {name!r}", f"use one of: {', '.join(table)}")
    return preset(*table[key])


def default_head(config) -> str:
    """The pretraining head a config's family uses: ``"clm"`` for causal stacks, else ``"mlm"``."""
    return "clm" if config.causal else "mlm"
