"""Contextual representations: vectors per token, per word and per sentence.

The BERT paper's feature-based experiments (Devlin et al. 2019, table 7) combine layers in a few
fixed ways; :data:`STRATEGIES` names them. Word vectors pool a word's pieces (first, mean or
last piece); sentence vectors pool tokens ([CLS], mean or max over real tokens).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from lmlab.pipelines.base import model_inputs
from lmlab.utils.errors import LmlabError


def _weighted_sum(hidden: Sequence[torch.Tensor]) -> torch.Tensor:
    """All layers summed with equal weights 1 / (L+1)."""
    stacked = torch.stack(list(hidden))  # (L+1, B, T, H)
    return (stacked * (1.0 / stacked.shape[0])).sum(0)


STRATEGIES: dict[str, Callable[[Sequence[torch.Tensor]], torch.Tensor]] = {
    "embeddings": lambda hs: hs[0],
    "last": lambda hs: hs[-1],
    "second_to_last": lambda hs: hs[-2],
    "sum_last_four": lambda hs: torch.stack(list(hs[-4:])).sum(0),
    "concat_last_four": lambda hs: torch.cat(list(hs[-4:]), dim=-1),
    "weighted_sum_all": _weighted_sum,
}


def combine_layers(hidden_states: Sequence[torch.Tensor], layer: int | str = "last") -> torch.Tensor:
    """One (B, T, D) tensor from the per-layer hidden states: a layer index (0 = embeddings,
    -1 = last) or a strategy name of :data:`STRATEGIES`."""
    if isinstance(layer, int) or (isinstance(layer, str) and layer.lstrip("-").isdigit()):
        index = int(layer)
        if not -len(hidden_states) <= index < len(hidden_states):
            raise LmlabError(f"layer {index} does not exist (the model has "
                             f"{len(hidden_states) - 1} layers plus the embeddings, index 0)",
                             f"use a layer between 0 and {len(hidden_states) - 1}, or -1")
        return hidden_states[index]
    if layer not in STRATEGIES:
        raise LmlabError(f"unknown feature strategy {layer!r}",
                         f"use a layer index or one of {', '.join(STRATEGIES)}")
    summed = {"sum_last_four": hidden_states[-4:], "weighted_sum_all": hidden_states}
    widths = sorted({h.shape[-1] for h in summed.get(layer, ())})
    if len(widths) > 1:  # an AWD-LSTM's layers are E, H, H, E wide
        raise LmlabError(f"{layer!r} adds hidden states of different widths "
                         f"({', '.join(map(str, widths))}) in this model",
                         "use one layer index, or concat_last_four")
    return STRATEGIES[layer](hidden_states)


def max_input_length(model, tokenizer) -> int | None:
    """The longest input the model takes: the tokenizer's limit and the position table's
    (None: no limit, T5's relative positions with an unlimited tokenizer)."""
    limits = [tokenizer.model_max_length] if tokenizer.model_max_length else []
    if getattr(model.config, "is_encoder_decoder", False):
        if getattr(model, "max_length", None) is not None:
            limits.append(model.max_length)
    else:
        limits.append(model.config.max_position_embeddings - model.config.position_offset)
    return min(limits) if limits else None


def input_limit(model, tokenizer, max_length: int | None = None) -> int | None:
    """``max_length`` if the model can take it (refused with a message if not), else the
    model's own limit (:func:`max_input_length`)."""
    limit = max_input_length(model, tokenizer)
    if max_length is None:
        return limit
    if max_length < 2:
        raise LmlabError(f"max_length {max_length} leaves no room for a token",
                         "use at least 2 (the special tokens take some)")
    if limit is not None and max_length > limit:
        raise LmlabError(f"max_length {max_length} is more than this model takes ({limit} "
                         "tokens)", f"use {limit} or less (--max-length {limit})")
    return max_length


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
        if pooling not in ("first", "mean", "last"):
            raise LmlabError(f"unknown word pooling {pooling!r}", "use first, mean or last")
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
    def _hidden(self, texts: Sequence[str]):
        batch = self.tokenizer(list(texts), padding=True, truncation=True,
                               max_length=self.max_length, return_tensors="pt",
                               return_offsets_mapping=True)
        out = self.model(**model_inputs(self.model, batch), output_hidden_states=True, heads=[])
        return batch, out

    def encode(self, texts: Sequence[str]) -> list[EncodedText]:
        """Per-token vectors (of the configured layer/strategy) for each text. With
        ``layer="all"`` every hidden state is kept: vectors (T, L+1, H), one pass for all layers
        (word pooling works the same, giving (L+1, H) per word)."""
        results = []
        for start in range(0, len(texts), self.batch_size):
            chunk = list(texts[start:start + self.batch_size])
            batch, out = self._hidden(chunk)
            features = (torch.stack(out.hidden_states, dim=2) if self.layer == "all"  # (B,T,L+1,H)
                        else combine_layers(out.hidden_states, self.layer)).float().cpu()
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
        if pooling not in ("cls", "mean", "max"):
            raise LmlabError(f"unknown sentence pooling {pooling!r}", "use cls, mean or max")
        vectors = []
        for start in range(0, len(texts), self.batch_size):
            batch, out = self._hidden(texts[start:start + self.batch_size])
            features = combine_layers(out.hidden_states, self.layer).float()
            mask = batch["attention_mask"].to(features.device).unsqueeze(-1).float()  # (B, T, 1)
            if pooling == "cls":
                vectors.append(features[:, 0])
            elif pooling == "mean":
                vectors.append((features * mask).sum(1) / mask.sum(1).clamp(min=1))
            else:
                vectors.append(features.masked_fill(mask == 0, float("-inf")).max(1).values)
        return torch.cat(vectors).cpu()
