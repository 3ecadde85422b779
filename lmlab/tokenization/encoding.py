"""The result of encoding texts: a dict with Hugging Face key names plus the engine encodings."""

from __future__ import annotations

from typing import Any

from lmlab.utils.errors import LmlabError


class BatchEncoding(dict):
    """``{"input_ids": ..., "attention_mask": ..., ...}`` as lists or tensors, with Hugging
    Face's key names (so ``model(**batch)`` works), keeping the per-sequence engine encodings
    for :meth:`word_ids` and :meth:`sequence_ids` (whole-word masking, token classification and
    question answering need them).
    """

    def __init__(self, data: dict[str, Any], encodings: list[Any] | None = None):
        super().__init__(data)
        self.encodings = encodings or []

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def _encoding(self, index: int) -> Any:
        if not self.encodings:
            raise LmlabError("this BatchEncoding keeps no per-sequence encodings",
                             "encode with the lmlab Tokenizer to get word ids")
        if not -len(self.encodings) <= index < len(self.encodings):
            raise LmlabError(f"sequence index {index} is out of range "
                             f"(batch of {len(self.encodings)})", "use an index in range")
        return self.encodings[index]

    def word_ids(self, batch_index: int = 0) -> list[int | None]:
        """Index of the word each token belongs to (None for special and padding tokens)."""
        return self._encoding(batch_index).word_ids

    def sequence_ids(self, batch_index: int = 0) -> list[int | None]:
        """0 for tokens of the first text, 1 for the pair's second, None for special tokens."""
        return self._encoding(batch_index).sequence_ids

    def tokens(self, batch_index: int = 0) -> list[str]:
        """The token strings of one sequence."""
        return self._encoding(batch_index).tokens

    def to(self, device: Any) -> BatchEncoding:
        """Move every tensor to ``device`` (in place); returns self."""
        for key, value in self.items():
            if hasattr(value, "to"):
                self[key] = value.to(device)
        return self
