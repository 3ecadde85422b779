"""Named model sizes: ``preset("bert", "base")`` -> :class:`TransformerConfig`.

The encoder presets are the sizes the papers and their released checkpoints use, so a preset
trained from scratch is comparable to the paper's model and a preset config matches the
config.json of the released weights:

- BERT tiny / mini / small / medium: Turc et al. 2019, "Well-Read Students Learn Better"
  (L2/H128, L4/H256, L4/H512, L8/H512); base (L12/H768) and large (L24/H1024): Devlin et al.
  2019. Heads = H / 64, feed-forward 4H.
- RoBERTa base / large (Liu et al. 2019): BERT's shapes, 50265 BPE tokens, fairseq positions.
- ALBERT base / large (Lan et al. 2020): E = 128, one shared layer, ``gelu_new``.
- ELECTRA small / base discriminators and their generators (Clark et al. 2020). Generator
  sizes follow the paper's multipliers of hidden size, FFN size and head count (1/4 for Small,
  1/3 for Base; Table 7). Note: the *released* google/electra-small-generator is full size
  (H256, 4 heads, FF1024); ``"small-generator-released"`` is that one.
- DistilBERT base (Sanh et al. 2019): 6 layers of BERT-base, no token types.

The table is open: :func:`register_preset` adds sizes (the decoder presets of
:mod:`lmlab.models.presets_decoders` register themselves on first use).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from lmlab.models.config import TransformerConfig
from lmlab.utils.errors import LmlabError

PresetFactory = Callable[[], TransformerConfig]
_PRESETS: dict[tuple[str, str], PresetFactory] = {}
_DECODERS_MODULE = "lmlab.models.presets_decoders"
_decoders_loaded = False


def register_preset(family: str, size: str,
                    factory: PresetFactory | dict[str, Any]) -> None:
    """Add (or replace) the preset ``(family, size)``.

    ``factory`` is a function returning a fresh :class:`TransformerConfig`, or a dict of
    TransformerConfig field values.
    """
    if isinstance(factory, dict):
        values = dict(factory)
        _PRESETS[(family, size)] = lambda: TransformerConfig(**values)
    elif callable(factory):
        _PRESETS[(family, size)] = factory
    else:
        raise LmlabError(f"preset {family}/{size}: factory must be a callable or a dict of "
                         f"config fields, not {type(factory).__name__}",
                         "pass e.g. lambda: TransformerConfig(...)")


def _load_decoder_presets() -> None:
    """Import the decoder presets module once, if it exists, and let it register its sizes."""
    global _decoders_loaded
    if _decoders_loaded:
        return
    _decoders_loaded = True
    try:
        module = importlib.import_module(_DECODERS_MODULE)
    except ModuleNotFoundError as error:
        if error.name != _DECODERS_MODULE:
            raise
        return
    register_into = getattr(module, "register_into", None)
    if register_into is not None:
        register_into(register_preset)


def preset(family: str, size: str, **overrides: Any) -> TransformerConfig:
    """The config of a named size, with optional field overrides.

    Example:
        >>> preset("bert", "mini").hidden_size
        256
        >>> preset("bert", "tiny", vocab_size=8000).vocab_size
        8000
    """
    _load_decoder_presets()
    factory = _PRESETS.get((family, size))
    if factory is None:
        families = sorted({f for f, _ in _PRESETS})
        if family in families:
            sizes = ", ".join(s for f, s in list_presets() if f == family)
            raise LmlabError(f"no {family} preset named {size!r}", f"{family} sizes: {sizes}")
        raise LmlabError(f"no presets for family {family!r}",
                         f"families with presets: {', '.join(families)}")
    config = factory()
    if overrides:
        values = {**config.to_dict(), **overrides}
        if "num_attention_heads" in overrides and "head_dim" not in overrides:
            values["head_dim"] = None  # recomputed from the new head count
        if "num_attention_heads" in overrides and "num_key_value_heads" not in overrides:
            values["num_key_value_heads"] = None
        if "pad_token_id" in overrides and "position_offset" not in overrides \
                and config.position_offset > 0:
            # RoBERTa numbers positions from pad_token_id + 1: keep that tied to the new pad id
            pad = overrides["pad_token_id"]
            values["position_offset"] = pad + 1 if pad is not None else 0
        config = TransformerConfig.from_dict(values)
    return config


def list_presets() -> list[tuple[str, str]]:
    """Every ``(family, size)`` with a preset, in registration order."""
    _load_decoder_presets()
    return list(_PRESETS)


def preset_table() -> list[dict[str, Any]]:
    """One row per preset: family, size, layers, hidden, heads, FFN width, E, parameters."""
    rows = []
    for family, size in list_presets():
        config = preset(family, size)
        rows.append({
            "family": family, "size": size, "layers": config.num_hidden_layers,
            "hidden": config.hidden_size, "heads": config.num_attention_heads,
            "intermediate": config.intermediate_size, "embedding": config.input_embedding_size,
            "vocab": config.vocab_size, "parameters": config.num_parameters(),
        })
    return rows


# -- encoder presets ----------------------------------------------------------------------------
def _bert(hidden: int, layers: int, **fields: Any) -> PresetFactory:
    values = dict(family="bert", vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers,
                  num_attention_heads=hidden // 64, intermediate_size=4 * hidden,
                  hidden_act="gelu", max_position_embeddings=512, type_vocab_size=2,
                  norm_eps=1e-12, pad_token_id=0)
    values.update(fields)
    return lambda: TransformerConfig(**values)


def _roberta(hidden: int, layers: int) -> PresetFactory:
    # fairseq numbering: positions start at pad_token_id + 1 = 2, so the table has 512 + 2 rows
    return _bert(hidden, layers, family="roberta", vocab_size=50265, max_position_embeddings=514,
                 position_offset=2, type_vocab_size=1, norm_eps=1e-5, pad_token_id=1,
                 bos_token_id=0, eos_token_id=2, extra={"mlm_head_act": "gelu"})


def _albert(hidden: int, layers: int) -> PresetFactory:
    return _bert(hidden, layers, family="albert", vocab_size=30000, embedding_size=128,
                 share_layers=True, hidden_act="gelu_new", hidden_dropout_prob=0.0,
                 attention_probs_dropout_prob=0.0, bos_token_id=2, eos_token_id=3)


def _electra(hidden: int, heads: int, intermediate: int, embedding: int) -> PresetFactory:
    return _bert(hidden, 12, family="electra", num_attention_heads=heads,
                 intermediate_size=intermediate,
                 embedding_size=embedding if embedding != hidden else None,
                 extra={"mlm_head_act": "gelu"})


for _size, (_hidden, _layers) in {"tiny": (128, 2), "mini": (256, 4), "small": (512, 4),
                                  "medium": (512, 8), "base": (768, 12),
                                  "large": (1024, 24)}.items():
    register_preset("bert", _size, _bert(_hidden, _layers))
register_preset("roberta", "base", _roberta(768, 12))
register_preset("roberta", "large", _roberta(1024, 24))
register_preset("albert", "base", _albert(768, 12))
register_preset("albert", "large", _albert(1024, 24))
register_preset("electra", "small", _electra(256, 4, 1024, 128))
register_preset("electra", "small-generator", _electra(64, 1, 256, 128))
register_preset("electra", "small-generator-released", _electra(256, 4, 1024, 128))
register_preset("electra", "base", _electra(768, 12, 3072, 768))
register_preset("electra", "base-generator", _electra(256, 4, 1024, 768))
register_preset("distilbert", "base", _bert(768, 6, family="distilbert", type_vocab_size=0,
                                           extra={"qa_dropout": 0.1, "seq_classif_dropout": 0.2}))
