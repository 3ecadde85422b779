"""lmlab: pretrained Transformer language models on one machine.

The top-level names are imported lazily so ``import lmlab`` stays light (no torch until a model,
tokenizer or pipeline is actually used).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

# public name -> "module:attribute"
_LAZY = {
    "Tokenizer": "lmlab.tokenization.tokenizer:Tokenizer",
    "from_pretrained": "lmlab.load:from_pretrained",
    "save_pretrained": "lmlab.interop.native:save_pretrained",
    "pipeline": "lmlab.pipelines:pipeline",
    "LmlabError": "lmlab.utils.errors:LmlabError",
    "pretrain": "lmlab.training.pretrain:pretrain",
    "PretrainConfig": "lmlab.training.pretrain:PretrainConfig",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'lmlab' has no attribute {name!r}")
    from lmlab.utils.lazy import import_attribute

    value = globals()[name] = import_attribute(target)
    return value
