"""The token ids an objective needs: padding, [CLS]/[SEP], [MASK], and which ids are special
(never masked, never drawn as random replacements). Free of torch: the CLI builds it cheaply."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from lmlab.utils.errors import LmlabError

# Token strings tried, in order, for each role when a raw ``tokenizers.Tokenizer`` is given.
_ROLE_TOKENS = {
    "pad_id": ("[PAD]", "<pad>"),
    "cls_id": ("[CLS]", "<s>"),
    "sep_id": ("[SEP]", "</s>"),
    "mask_id": ("[MASK]", "<mask>"),
    "bos_id": ("<s>",),
    "eos_id": ("</s>",),
    "unk_id": ("[UNK]", "<unk>"),
}


@dataclass(frozen=True)
class SpecialTokens:
    """Vocabulary size and special-token ids of the tokenizer an objective works with;
    ``special_ids`` lists every id that is not text ([PAD], [CLS], [SEP], [MASK], [UNK], ...)."""

    vocab_size: int
    pad_id: int
    cls_id: int
    sep_id: int
    mask_id: int | None = None
    bos_id: int | None = None
    eos_id: int | None = None
    special_ids: tuple[int, ...] = field(default_factory=tuple)
    sentinel_ids: tuple[int, ...] = field(default_factory=tuple)  # T5's <extra_id_0>, 1, ...

    def __post_init__(self) -> None:
        ids = {self.pad_id, self.cls_id, self.sep_id, *self.special_ids}
        ids |= {i for i in (self.mask_id, self.bos_id, self.eos_id) if i is not None}
        bad = sorted(i for i in ids if not 0 <= i < self.vocab_size)
        if bad:
            raise LmlabError(f"special token ids {bad} lie outside the vocabulary "
                             f"(size {self.vocab_size})",
                             "build SpecialTokens from the tokenizer the shards were written with")
        object.__setattr__(self, "special_ids", tuple(sorted(ids)))

    def require_mask(self) -> int:
        """The [MASK] id; an error naming the fix when the tokenizer has none."""
        if self.mask_id is None:
            raise LmlabError("the tokenizer has no mask token, which masked-LM objectives need",
                             "use a tokenizer trained with a [MASK]/<mask> special token")
        return self.mask_id

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON values (lists for the id tuples)."""
        return {**asdict(self), "special_ids": list(self.special_ids),
                "sentinel_ids": list(self.sentinel_ids)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SpecialTokens:
        values = dict(values)
        values["special_ids"] = tuple(values.get("special_ids", ()))
        values["sentinel_ids"] = tuple(values.get("sentinel_ids", ()))
        return cls(**values)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> SpecialTokens:
        """From an ``lmlab.Tokenizer`` (by role) or a raw ``tokenizers.Tokenizer`` (by the usual
        BERT / RoBERTa token strings)."""
        if hasattr(tokenizer, "cls_token_id"):  # lmlab.Tokenizer (or a transformers tokenizer)
            # T5 has no start token and GPT-2-style vocabularies no pad: end-of-text stands in
            eos = tokenizer.eos_token_id
            cls_ = _first(tokenizer.cls_token_id, tokenizer.bos_token_id, eos)
            sep = _first(tokenizer.sep_token_id, eos)
            pad = _first(tokenizer.pad_token_id, eos)
            if pad is None or cls_ is None or sep is None:
                raise LmlabError("the tokenizer lacks a pad, cls/bos or sep/eos token",
                                 "pretraining encoders needs [PAD], [CLS] and [SEP] (or <pad>, "
                                 "<s>, </s>); train the tokenizer with a bert or roberta template")
            return cls(vocab_size=len(tokenizer), pad_id=pad, cls_id=cls_, sep_id=sep,
                       mask_id=tokenizer.mask_token_id, bos_id=tokenizer.bos_token_id,
                       eos_id=tokenizer.eos_token_id,
                       special_ids=tuple(i for i in tokenizer.all_special_ids if i is not None),
                       sentinel_ids=sentinel_ids(tokenizer.get_vocab().get)
                       if hasattr(tokenizer, "get_vocab") else ())  # CANINE: no vocabulary
        if hasattr(tokenizer, "token_to_id"):  # tokenizers.Tokenizer
            found = {role: _first(*(tokenizer.token_to_id(t) for t in tokens))
                     for role, tokens in _ROLE_TOKENS.items()}
            if found["pad_id"] is None or found["cls_id"] is None or found["sep_id"] is None:
                raise LmlabError("could not find [PAD]/[CLS]/[SEP] (or <pad>/<s>/</s>) in the "
                                 "tokenizer's vocabulary",
                                 "build SpecialTokens(...) by hand with the right ids")
            added = [t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special]
            special = tuple(tokenizer.token_to_id(t) for t in added)
            unk = found.pop("unk_id")
            extra = (unk,) if unk is not None else ()
            return cls(vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
                       special_ids=special + extra,
                       sentinel_ids=sentinel_ids(tokenizer.token_to_id), **found)
        raise LmlabError(f"cannot read special tokens from a {type(tokenizer).__name__}",
                         "pass an lmlab.Tokenizer or a tokenizers.Tokenizer")


def _first(*ids: int | None) -> int | None:
    """The first id that is not None (None if all are)."""
    return next((i for i in ids if i is not None), None)


def sentinel_ids(token_to_id: Any) -> tuple[int, ...]:
    """Ids of T5's sentinels ``<extra_id_0>``, ``<extra_id_1>``, ... in that order, as far as
    the vocabulary has them without a gap (none: an empty tuple)."""
    found: list[int] = []
    while True:
        token_id = token_to_id(f"<extra_id_{len(found)}>")
        if token_id is None or (isinstance(token_id, int) and token_id < 0):
            return tuple(found)
        found.append(int(token_id))
