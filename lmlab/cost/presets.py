"""The model sizes ``lmlab cost estimate --model`` knows: every preset as ``<family>-<size>``
(``bert-base``), the recurrent ones (``awd-lstm-paper``, ``elmo-small``) and the short names of
released models (``distilbert``, ``smollm2-135m``, ``ulmfit``, ``elmo``). The shapes are the
family specs' (one source of truth)."""

from __future__ import annotations

from lmlab.utils.checks import check_choice

# short names of released models -> (family, size)
_SHORT_NAMES = {"distilbert": ("distilbert", "base"), "smollm2-135m": ("llama", "smollm2-135m"),
                "ulmfit": ("awd-lstm", "paper"), "elmo": ("elmo", "paper")}


def _table() -> dict[str, tuple[str, str]]:
    from lmlab.models.presets import list_presets
    from lmlab.models.rnn.config import SIZES as RECURRENT_SIZES

    table = {f"{family}-{size}": (family, size) for family, size in list_presets()}
    table.update({f"{family}-{size}": (family, size)
                  for family, sizes in RECURRENT_SIZES.items() for size in sizes})
    table.update(_SHORT_NAMES)
    return table


def preset_names() -> list[str]:
    """Names accepted by :func:`preset_config` (and ``lmlab cost estimate --model``)."""
    return list(_table())


def preset_config(name: str):
    """The config of a named model size (a ``RecurrentConfig`` for AWD-LSTM and ELMo, with the
    presets' 30,522-token vocabulary); an unknown name refuses, listing the known ones."""
    from lmlab.models.presets import preset

    table = _table()
    key = check_choice(name.strip().lower(), table, "--model", "model size")
    return preset(*table[key])


def default_head(config) -> str:
    """The pretraining head a config's family uses: ``"clm"`` for causal stacks and the
    recurrent LMs (ELMo's two directions' softmax), ``"plm"`` for XLNet, else ``"mlm"``."""
    from lmlab.models.rnn.config import FAMILIES as RECURRENT_FAMILIES

    if config.family == "xlnet":
        return "plm"
    return "clm" if config.family in RECURRENT_FAMILIES or config.causal else "mlm"
