"""Named model sizes: ``preset("bert", "base")`` -> :class:`TransformerConfig`, from the families'
``sizes`` (their sources: docs/models.md); :func:`register_preset` adds your own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lmlab.models.config import TransformerConfig
from lmlab.models.families import KNOWN_FAMILIES, get_family
from lmlab.models.rnn.config import SIZES as RECURRENT_SIZES
from lmlab.models.rnn.config import recurrent_preset
from lmlab.utils.errors import LmlabError

PresetFactory = Callable[[], TransformerConfig]
_PRESETS: dict[tuple[str, str], PresetFactory] = {}  # added by register_preset


def register_preset(family: str, size: str,
                    factory: PresetFactory | dict[str, Any]) -> None:
    """Add (or replace) the preset ``(family, size)``: a function returning a fresh
    :class:`TransformerConfig`, or a dict of its field values."""
    if isinstance(factory, dict):
        values = dict(factory)
        _PRESETS[(family, size)] = lambda: TransformerConfig(**values)
    elif callable(factory):
        _PRESETS[(family, size)] = factory
    else:
        raise LmlabError(f"preset {family}/{size}: factory must be a callable or a dict of "
                         f"config fields, not {type(factory).__name__}",
                         "pass e.g. lambda: TransformerConfig(...)")


def family_config(family: str, **fields: Any) -> TransformerConfig:
    """A config of ``family``'s shape with the given sizes and overrides."""
    return get_family(family).config(**fields)


def preset(family: str, size: str, **overrides: Any) -> TransformerConfig:
    """The config of a named size (recurrent families too), with field overrides."""
    if family in RECURRENT_SIZES:  # AWD-LSTM, ELMo: lmlab.models.rnn (not Transformers)
        return recurrent_preset(family, size, **overrides)  # type: ignore[return-value]
    factory = _PRESETS.get((family, size))
    if factory is not None:
        config = factory()
    elif family in KNOWN_FAMILIES and size in get_family(family).sizes:
        config = family_config(family, **get_family(family).sizes[size])
    else:
        presets = list_presets()
        if family in {f for f, _ in presets}:
            sizes = ", ".join(s for f, s in presets if f == family)
            raise LmlabError(f"no {family} preset named {size!r}", f"{family} sizes: {sizes}")
        raise LmlabError(f"no presets for family {family!r}", "families with presets: "
                         f"{', '.join(sorted({f for f, _ in presets}))}")
    if overrides:
        values = {**config.to_dict(), **overrides}
        if "num_attention_heads" in overrides and "head_dim" not in overrides:
            values["head_dim"] = None  # recomputed from the new head count
        if "num_attention_heads" in overrides and "num_key_value_heads" not in overrides:
            values["num_key_value_heads"] = None
        if "pad_token_id" in overrides and "position_offset" not in overrides \
                and config.family in ("roberta", "xlm-roberta", "longformer"):
            # RoBERTa numbers positions from pad_token_id + 1: keep that tied to the new pad id
            pad = overrides["pad_token_id"]
            values["position_offset"] = pad + 1 if pad is not None else 0
        config = TransformerConfig.from_dict(values)
    return config


def list_presets() -> list[tuple[str, str]]:
    """Every ``(family, size)`` with a preset: the families' own, then those registered."""
    names = [(family, size) for family in KNOWN_FAMILIES for size in get_family(family).sizes]
    return names + [name for name in _PRESETS if name not in names]
