"""The model sizes ``lmlab cost estimate --model`` knows: every preset as ``<family>-<size>``
(``bert-base``), the recurrent ones (``awd-lstm-paper``, ``elmo-small``), the short names of
released models (``distilbert``, ``smollm2-135m``, ``ulmfit``, ``elmo``) and GPT-3's sizes
(``gpt3-175b``: GPT-2's decoder at the paper's shapes, for cost only). The shapes are the
family specs' (one source of truth)."""

from __future__ import annotations

from lmlab.utils.checks import check_choice

# short names of released models -> (family, size)
_SHORT_NAMES = {"distilbert": ("distilbert", "base"), "smollm2-135m": ("llama", "smollm2-135m"),
                "ulmfit": ("awd-lstm", "paper"), "elmo": ("elmo", "paper")}
# GPT-3's sizes (Brown et al. 2020, Table 2.1: layers, width, head width; 2,048 positions,
# GPT-2's 50,257-token vocabulary, feed-forward 4 x width) on GPT-2's decoder, with width / head
# width heads (the table's XL row, 24 heads of 128, does not multiply to its 2,048; FLOPs
# depend on the width only); the alternating locally banded layers are counted dense
_GPT3 = {"small": (12, 768, 64), "medium": (24, 1024, 64), "large": (24, 1536, 96),
         "xl": (24, 2048, 128), "2.7b": (32, 2560, 80), "6.7b": (32, 4096, 128),
         "175b": (96, 12288, 128)}


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
    return [*_table(), *(f"gpt3-{size}" for size in _GPT3)]


def preset_config(name: str):
    """The config of a named model size (a ``RecurrentConfig`` for AWD-LSTM and ELMo, with the
    presets' 30,522-token vocabulary); an unknown name refuses, listing the known ones."""
    from lmlab.models.presets import preset

    table = _table()
    key = check_choice(name.strip().lower(), [*table, *(f"gpt3-{s}" for s in _GPT3)],
                       "--model", "model size")
    if key.startswith("gpt3-"):
        layers, width, head_dim = _GPT3[key.removeprefix("gpt3-")]
        return preset("gpt2", "small", num_hidden_layers=layers, hidden_size=width,
                      num_attention_heads=width // head_dim, intermediate_size=4 * width,
                      max_position_embeddings=2048)
    return preset(*table[key])


def default_head(config) -> str:
    """The pretraining head a config's family uses: ``"clm"`` for causal stacks and the
    recurrent LMs (ELMo's two directions' softmax), ``"plm"`` for XLNet, else ``"mlm"``."""
    from lmlab.models.rnn.config import FAMILIES as RECURRENT_FAMILIES

    if config.family == "xlnet":
        return "plm"
    return "clm" if config.family in RECURRENT_FAMILIES or config.causal else "mlm"
