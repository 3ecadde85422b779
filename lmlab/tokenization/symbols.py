"""A tokenizer over a closed set of symbols: one token per space-separated symbol, for generated
data with a small known alphabet (the expressions of :mod:`lmlab.tasks.integration`), where
learned subwords would only split ``INT+`` or ``cos`` arbitrarily. It has T5's special tokens and
template and saves and loads as every lmlab tokenizer."""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer as Engine
from tokenizers import models, pre_tokenizers

from lmlab.tokenization.templates import build_post_processor, get_family
from lmlab.tokenization.tokenizer import Tokenizer
from lmlab.utils.errors import LmlabError


def symbol_tokenizer(symbols: Iterable[str], model_max_length: int = 512) -> Tokenizer:
    """A word-level :class:`Tokenizer` whose vocabulary is T5's special tokens, then
    ``symbols`` (sorted, duplicates dropped)."""
    family = get_family("t5")
    special = family.ordered_tokens()
    vocabulary = sorted(set(symbols) - set(special))
    bad = [s for s in vocabulary if not s or any(c.isspace() for c in s)]
    if bad:
        raise LmlabError(f"symbols must be non-empty and contain no whitespace: {bad[:5]}",
                         "pass the symbols one by one (e.g. text.split())")
    if not vocabulary:
        raise LmlabError("no symbols to build a tokenizer from", "pass the data's symbols")
    vocab = {token: index for index, token in enumerate([*special, *vocabulary])}
    engine = Engine(models.WordLevel(vocab, unk_token=family.special_tokens["unk_token"]))
    engine.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    engine.add_special_tokens(special)
    engine.post_processor = build_post_processor("t5", family.special_tokens,
                                                 engine.token_to_id)
    return Tokenizer(engine, family="t5", model_max_length=model_max_length,
                     do_lower_case=False)
