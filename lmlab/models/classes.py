"""Which model class builds a config: an encoder-decoder, a family with a stack of its own
(CANINE's characters), or the one-stack :class:`~lmlab.models.model.LanguageModel`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from lmlab.models.config import TransformerConfig
from lmlab.utils.lazy import resolve_entry

#: family -> "module:Class" of the families that are not one core stack
OWN_CLASSES: dict[str, object] = {"canine": "lmlab.models.canine:CanineModel",
                                   "xlnet": "lmlab.models.xlnet:XLNetModel"}


def model_class(config: TransformerConfig) -> type:
    """The class whose ``(config, heads=..., with_pooler=...)`` builds this model."""
    if config.family in OWN_CLASSES:
        return resolve_entry(OWN_CLASSES, config.family)
    if config.is_encoder_decoder:
        from lmlab.models.seq2seq import EncoderDecoderModel

        return EncoderDecoderModel
    from lmlab.models.model import LanguageModel

    return LanguageModel


def build_model(config: TransformerConfig, heads: Sequence[str], state_keys: Iterable[str] = ()):
    """The model of ``config`` with ``heads``, and BERT's pooler when the saved state it will
    load (``state_keys``) holds one: how every reader of a saved config rebuilds the model."""
    has_pooler = any(key.startswith("pooler.") for key in state_keys)
    return model_class(config)(config, heads=list(heads), with_pooler=has_pooler or None)
