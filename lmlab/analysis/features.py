"""Contextual representations: vectors per token, per word and per sentence.

The BERT paper's feature-based experiments (Devlin et al. 2019, table 7) combine layers in a few
fixed ways; :data:`STRATEGIES` names them. Word vectors pool a word's pieces (first, mean or
last piece); sentence vectors pool tokens ([CLS], mean or max over real tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lmlab.models.inputs import input_limit, model_inputs
from lmlab.models.pooling import combine_layers, masked_mean
from lmlab.utils.checks import check_choice


def run_texts(model, tokenizer, texts: Sequence[str], max_length: int, **options):
    """The padded batch of ``texts`` (with character offsets; ``options`` go to the tokenizer)
    and the model's hidden states on it, L+1 tensors (B, T, H): every feature's forward pass."""
    batch = tokenizer(list(texts), padding=True, truncation=True, max_length=max_length,
                      return_tensors="pt", return_offsets_mapping=True, **options)
    out = model(**model_inputs(model, batch), output_hidden_states=True, heads=[])
    return batch, out.hidden_states


@dataclass
class EncodedText:
    """One text's tokens and their vectors, with the words they belong to."""

    text: str
    tokens: list[str]
    vectors: torch.Tensor  # (T, D) over real tokens, special tokens included
    word_ids: list[int | None]
    offsets: list[tuple[int, int]]

    def word_vectors(self, pooling: str = "mean") -> tuple[list[str], torch.Tensor]:
        """The words of the text (by the tokenizer's pre-tokenisation) and one vector each,
        pooled from their pieces: ``"first"``, ``"mean"`` or ``"last"``."""
        check_choice(pooling, ("first", "mean", "last"), "pooling", "word pooling")
        groups: dict[int, list[int]] = {}
        for position, word in enumerate(self.word_ids):
            if word is not None:
                groups.setdefault(word, []).append(position)
        words, vectors = [], []
        for word in sorted(groups):
            positions = groups[word]
            start, end = self.offsets[positions[0]][0], self.offsets[positions[-1]][1]
            words.append(self.text[start:end])
            pieces = self.vectors[positions]
            vectors.append(pieces[0] if pooling == "first" else pieces[-1] if pooling == "last"
                           else pieces.mean(0))
        if not vectors:
            return [], self.vectors.new_zeros(0, *self.vectors.shape[1:])
        return words, torch.stack(vectors)


class FeatureExtractor:
    """Runs a model over texts in batches and hands back per-token vectors.

    Example:
        >>> fx = FeatureExtractor(model, tokenizer, layer="sum_last_four")
        >>> encoded = fx.encode(["The vase broke.", "Dawn broke."])
        >>> words, vectors = encoded[0].word_vectors("mean")
    """

    def __init__(self, model, tokenizer, layer: int | str = "last", batch_size: int = 32,
                 max_length: int | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.layer = layer
        self.batch_size = batch_size
        self.max_length = input_limit(model, tokenizer, max_length)

    @torch.inference_mode()
    def encode(self, texts: Sequence[str]) -> list[EncodedText]:
        """Per-token vectors (of the configured layer/strategy) for each text. With
        ``layer="all"`` every hidden state is kept: vectors (T, L+1, H), one pass for all layers
        (word pooling works the same, giving (L+1, H) per word)."""
        results = []
        for start in range(0, len(texts), self.batch_size):
            chunk = list(texts[start:start + self.batch_size])
            batch, hidden = run_texts(self.model, self.tokenizer, chunk, self.max_length)
            features = (torch.stack(hidden, dim=2) if self.layer == "all"  # (B, T, L+1, H)
                        else combine_layers(hidden, self.layer)).float().cpu()
            for row, text in enumerate(chunk):
                positions = (batch["attention_mask"][row] == 1).nonzero().squeeze(-1).tolist()
                tokens, word_ids = batch.tokens(row), batch.word_ids(row)
                results.append(EncodedText(
                    text=text,
                    tokens=[tokens[p] for p in positions],
                    vectors=features[row, positions],
                    word_ids=[word_ids[p] for p in positions],
                    offsets=[tuple(batch["offset_mapping"][row, p].tolist()) for p in positions],
                ))
        return results

    @torch.inference_mode()
    def sentence_vectors(self, texts: Sequence[str], pooling: str = "mean") -> torch.Tensor:
        """(N, D) sentence vectors: ``"cls"`` (first token), ``"mean"`` or ``"max"`` over real
        tokens (padding excluded)."""
        check_choice(pooling, ("cls", "mean", "max"), "pooling", "sentence pooling")
        vectors = []
        for start in range(0, len(texts), self.batch_size):
            chunk = texts[start:start + self.batch_size]
            batch, hidden = run_texts(self.model, self.tokenizer, chunk, self.max_length)
            features = combine_layers(hidden, self.layer).float()
            mask = batch["attention_mask"].to(features.device)  # (B, T)
            if pooling == "cls":
                vectors.append(features[:, 0])
            elif pooling == "mean":
                vectors.append(masked_mean(features, mask))
            else:
                vectors.append(features.masked_fill(mask[..., None] == 0, float("-inf"))
                               .max(1).values)
        return torch.cat(vectors).cpu()
