"""CANINE's tokenizer: every character is its Unicode codepoint, nothing to train or store;
special tokens are private-use codepoints ([CLS] U+E000, [SEP] U+E001, [MASK] U+E003) and
[PAD] is 0. Ids, pairs, truncation and padding equal transformers' ``CanineTokenizer``'s; its
folder (``tokenizer_config.json``) loads in both (docs/characters.md).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lmlab.tokenization.encoding import BatchEncoding
from lmlab.tokenization.tokenizer import (
    Tokenizer,
    _as_tensors,
    _is_batched,
    _padding_arg,
    _side,
    _to_list,
    _truncation_args,
)
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import atomic_write_json, read_json

UNICODE_SIZE = 0x110000
TOKENIZER_CLASS = "CanineTokenizer"
#: role -> codepoint, as CanineTokenizer assigns them
SPECIAL_CODEPOINTS = {"pad_token": 0, "cls_token": 0xE000, "sep_token": 0xE001,
                      "bos_token": 0xE000, "eos_token": 0xE001, "mask_token": 0xE003}


class CharacterTokenizer:
    """Text -> codepoints with [CLS] ... [SEP] (pairs: [CLS] a [SEP] b [SEP]), token types all
    0, Hugging Face's calling convention (``tok(texts, padding=True, return_tensors="pt")``)."""

    family = "canine"
    vocab_size = UNICODE_SIZE

    def __init__(self, model_max_length: int = 2048, padding_side: str = "right",
                 truncation_side: str = "right", name_or_path: str = ""):
        self.model_max_length = model_max_length
        self.padding_side = _side(padding_side, "padding_side")
        self.truncation_side = _side(truncation_side, "truncation_side")
        self.name_or_path = name_or_path
        for role, codepoint in SPECIAL_CODEPOINTS.items():
            setattr(self, role, chr(codepoint))
            setattr(self, f"{role}_id", codepoint)
        self.all_special_ids = sorted(set(SPECIAL_CODEPOINTS.values()))

    def __len__(self) -> int:
        return UNICODE_SIZE

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """Role -> token, as transformers' ``CanineTokenizer`` reports them."""
        return {role: chr(codepoint) for role, codepoint in SPECIAL_CODEPOINTS.items()}

    def plain_engine(self) -> CodepointEngine:
        """What token shards encode sentences with (``lmlab data tokenize``)."""
        return CodepointEngine()

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> CharacterTokenizer:
        """Read a folder's ``tokenizer_config.json`` (a CanineTokenizer's)."""
        config = read_json(Path(path) / "tokenizer_config.json")
        if config.get("tokenizer_class") != TOKENIZER_CLASS:
            raise LmlabError(f"{path} holds a {config.get('tokenizer_class')}, not a "
                             f"{TOKENIZER_CLASS}", "load it with lmlab.Tokenizer.from_pretrained")
        return cls(int(config.get("model_max_length", 2048)),
                   config.get("padding_side", "right"), config.get("truncation_side", "right"),
                   str(path))

    def save_pretrained(self, path: str | os.PathLike) -> list[Path]:
        """Write ``tokenizer_config.json`` (all there is), which transformers loads too."""
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(folder / "tokenizer_config.json", {
            "tokenizer_class": TOKENIZER_CLASS, "model_max_length": self.model_max_length,
            "padding_side": self.padding_side, "truncation_side": self.truncation_side,
            **{role: chr(codepoint) for role, codepoint in SPECIAL_CODEPOINTS.items()}})
        return [folder / "tokenizer_config.json"]

    def fingerprint(self) -> str:
        """A hash of what decides the ids (codepoints, this max length, these sides), which
        runs record to tell whether two tokenizers encode alike."""
        state = [TOKENIZER_CLASS, self.model_max_length, self.padding_side, self.truncation_side]
        return hashlib.sha256(json.dumps(state).encode()).hexdigest()[:16]

    def tokenize(self, text: str) -> list[str]:
        return list(text)

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | list[int]:
        return ord(tokens) if isinstance(tokens, str) else [ord(t) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> str | list[str]:
        return chr(ids) if isinstance(ids, int) else [chr(int(i)) for i in ids]

    def _ids(self, first: str, second: str | None, special: bool, strategy: str | None,
             length: int | None, side: str) -> list[int]:
        """One sequence's ids, cut to ``length`` by ``strategy`` as transformers cuts."""
        parts = [[ord(c) for c in first]] + ([[ord(c) for c in second]] if second is not None
                                               else [])
        if strategy is not None and length is not None:
            budget = length - (len(parts) + 1 if special else 0)
            cut = _cut(parts, budget, strategy)
            if cut is None:
                raise LmlabError(f"cannot cut to max_length={length} with truncation="
                                 f"{strategy!r}", "use a larger max_length or truncation=True")
            parts = [p[len(p) - n:] if side == "left" else p[:n] for p, n in zip(parts, cut)]
        if not special:
            return [i for part in parts for i in part]
        ids = [self.cls_token_id, *parts[0], self.sep_token_id]
        return ids + ([*parts[1], self.sep_token_id] if len(parts) > 1 else [])

    def __call__(self, text: str | Sequence[str], text_pair: str | Sequence[str] | None = None,
                 *, add_special_tokens: bool = True, padding: bool | str = False,
                 truncation: bool | str | None = None, max_length: int | None = None,
                 pad_to_multiple_of: int | None = None, padding_side: str | None = None,
                 truncation_side: str | None = None, return_tensors: str | None = None,
                 return_token_type_ids: bool = True, return_attention_mask: bool = True,
                 ) -> BatchEncoding:
        """Encode a text, a batch, or (batches of) pairs; unbatched lists for one text."""
        batched = _is_batched(text, False)
        texts = list(text) if batched else [text]
        pairs = (list(text_pair) if batched else [text_pair]) if text_pair is not None \
            else [None] * len(texts)
        if len(pairs) != len(texts):
            raise LmlabError(f"{len(texts)} texts but {len(pairs)} text pairs",
                             "pass one pair per text")
        if not all(isinstance(t, str) for t in [*texts, *(p for p in pairs if p is not None)]):
            raise LmlabError("texts must be strings", "pass str or a list of str")
        pad = _padding_arg(padding)
        if truncation is None and pad is not None:  # transformers: max_length is the padding's
            truncation = False
        strategy, length = _truncation_args(truncation, max_length, self.model_max_length)
        side = _side(truncation_side or self.truncation_side, "truncation_side")
        rows = [self._ids(a, b, add_special_tokens, strategy, length, side)
                for a, b in zip(texts, pairs)]
        data = {"input_ids": rows, "token_type_ids": [[0] * len(r) for r in rows],
                "attention_mask": [[1] * len(r) for r in rows]}
        if pad is not None:
            target = (max_length or self.model_max_length) if pad == "max_length" \
                else max(map(len, rows))
            if pad_to_multiple_of:
                target = -(-target // pad_to_multiple_of) * pad_to_multiple_of
            left = _side(padding_side or self.padding_side, "padding_side") == "left"
            for key, fill in (("input_ids", self.pad_token_id), ("token_type_ids", 0),
                              ("attention_mask", 0)):
                data[key] = [[fill] * max(0, target - len(r)) + r if left
                             else r + [fill] * max(0, target - len(r)) for r in data[key]]
        if not return_token_type_ids:
            del data["token_type_ids"]
        if not return_attention_mask:
            del data["attention_mask"]
        if return_tensors is not None:
            data = _as_tensors(data, return_tensors)
        elif not batched:
            data = {key: value[0] for key, value in data.items()}
        return BatchEncoding(data)

    def encode(self, text: str, text_pair: str | None = None, add_special_tokens: bool = True,
               **kwargs: Any) -> list[int]:
        return self(text, text_pair, add_special_tokens=add_special_tokens, **kwargs)["input_ids"]

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        """The characters of ``ids`` (padding and the special codepoints dropped on request)."""
        skip = set(self.all_special_ids) if skip_special_tokens else set()
        return "".join(chr(i) for i in map(int, _to_list(ids)) if i not in skip)

    def batch_decode(self, sequences: Any, skip_special_tokens: bool = False) -> list[str]:
        return [self.decode(row, skip_special_tokens) for row in _to_list(sequences)]

    def __repr__(self) -> str:
        return f"CharacterTokenizer(codepoints, max_length={self.model_max_length})"


class _Encoding:
    """One text's ``ids`` (codepoints) and ``word_ids`` (each whitespace character a word of
    its own, each run between them one word), as a ``tokenizers.Encoding`` offers them."""

    def __init__(self, text: str):
        self.ids = [ord(c) for c in text]
        word, self.word_ids, space = -1, [], True
        for char in text:
            word += 1 if char.isspace() or space else 0
            self.word_ids.append(word)
            space = char.isspace()

    def __len__(self) -> int:
        return len(self.ids)


class CodepointEngine:
    """The codepoint tokenizer in the shape of a ``tokenizers.Tokenizer`` as token shards use
    one: ``encode_batch`` without special tokens, and ``to_str`` (:data:`CODEPOINTS`) for the
    workers, which rebuild it with :func:`engine_from_str`."""

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False
                     ) -> list[_Encoding]:
        if add_special_tokens:
            raise LmlabError("the codepoint engine encodes without special tokens",
                             "call the CharacterTokenizer for [CLS] ... [SEP]")
        return [_Encoding(text) for text in texts]

    def to_str(self) -> str:
        return CODEPOINTS


CODEPOINTS = json.dumps({"lmlab": "codepoints"})


def engine_from_str(serialized: str) -> Any:
    """A shards engine from its ``to_str()``: codepoints, or a ``tokenizers.Tokenizer``."""
    if serialized == CODEPOINTS:
        return CodepointEngine()
    from tokenizers import Tokenizer as Engine

    return Engine.from_str(serialized)


def _cut(parts: list[list[int]], budget: int, strategy: str) -> list[int] | None:
    """How many ids each part keeps within ``budget`` (None: the strategy cannot fit it):
    ``longest_first`` takes one from the longer part at a time (the second on a tie)."""
    sizes = [len(p) for p in parts]
    if budget < 0:
        return None
    if strategy == "longest_first":
        while sum(sizes) > budget:
            longer = 0 if len(sizes) == 1 or sizes[0] > sizes[1] else 1
            sizes[longer] -= 1
        return sizes
    index = 0 if strategy == "only_first" else 1
    if index >= len(sizes):
        return None if sum(sizes) > budget else sizes
    sizes[index] -= max(0, sum(sizes) - budget)
    return sizes if sizes[index] >= 0 else None


def load_tokenizer(path: str | os.PathLike) -> Any:
    """The tokenizer of a model folder: ``lmlab.Tokenizer.from_pretrained``, which hands a
    CanineTokenizer's folder to :class:`CharacterTokenizer`."""
    return Tokenizer.from_pretrained(path)
