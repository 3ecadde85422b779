"""Contextual nearest neighbours: the same word in different company. Every occurrence of a word
in a corpus is indexed by its contextual vector; a query sentence lists the nearest occurrences
(cosine): "The vase broke" lands near things breaking apart, "Dawn broke" near days beginning.
:class:`StaticWordVectors` (rows of the input embedding table) shows the context-free side; an
index built with ``layer="all"`` shows the neighbours at every layer (docs/representations.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from lmlab.analysis.features import FeatureExtractor
from lmlab.utils.errors import LmlabError


@dataclass
class Neighbour:
    score: float
    sentence: str
    word: str


def find_occurrences(sentences: Iterable[str], word: str, limit: int) -> list[str]:
    """Up to ``limit`` sentences containing ``word`` as a whole word (case-insensitive)."""
    pattern = re.compile(rf"(?<![\w'-]){re.escape(word)}(?![\w'-])", re.IGNORECASE)
    found, seen = [], set()
    for sentence in sentences:
        if len(sentence) > 400 or sentence in seen:
            continue
        if pattern.search(sentence):
            found.append(sentence)
            seen.add(sentence)
            if len(found) >= limit:
                break
    return found


def corpus_sentences(corpus_dir: str | Path, split: str = "train") -> Iterable[str]:
    """Every sentence of an lmlab corpus, streamed."""
    from lmlab.text.corpus import read_corpus

    for document in read_corpus(corpus_dir, split):
        yield from document.sentences


def wordnet_sentences() -> Iterable[str]:
    """WordNet 3.0's example sentences (always installed with lmlab's WordNet tasks): a small
    sentence source that needs no corpus build."""
    from lmlab.text.sources.wordnet import read_synsets

    for synset in read_synsets():
        yield from synset.examples


def _word_vector(encoded, word: str, pooling: str) -> torch.Tensor | None:
    words, vectors = encoded.word_vectors(pooling)
    for index, candidate in enumerate(words):
        if candidate.lower() == word.lower():
            return vectors[index]
    return None


@dataclass
class ContextualIndex:
    """Occurrences of one word, each with its contextual vector: (N, H) for one layer or
    strategy, (N, L+1, H) for ``layer="all"``.

    Example:
        >>> index = ContextualIndex.build(model, tok, corpus_sentences("corpus/"), "broke")
        >>> index.query("The vase broke.", k=5)
    """

    extractor: FeatureExtractor
    word: str
    pooling: str
    sentences: list[str]
    vectors: torch.Tensor  # unit rows

    @classmethod
    def build(cls, model, tokenizer, sentences: Iterable[str], word: str, layer: int | str = "last",
              limit: int = 2000, pooling: str = "mean", batch_size: int = 32) -> ContextualIndex:
        extractor = FeatureExtractor(model, tokenizer, layer=layer, batch_size=batch_size)
        found = find_occurrences(sentences, word, limit)
        if not found:
            raise LmlabError(f"no sentence of the corpus contains the word {word!r}",
                             "pick a word that occurs in the corpus, or a larger corpus")
        vectors, kept = [], []
        for encoded in extractor.encode(found):
            vector = _word_vector(encoded, word, pooling)
            if vector is not None:
                vectors.append(vector)
                kept.append(encoded.text)
        if not vectors:
            raise LmlabError(f"the tokenizer never splits out {word!r} as a word",
                             "query a word as the tokenizer's pre-tokeniser sees it")
        return cls(extractor, word, pooling, kept,
                   torch.nn.functional.normalize(torch.stack(vectors), dim=-1))

    @property
    def all_layers(self) -> bool:
        return self.extractor.layer == "all"

    def _scores(self, sentence: str) -> torch.Tensor:
        """Cosine of every occurrence with the word in ``sentence``: (N,) or (N, L+1)."""
        encoded = self.extractor.encode([sentence])[0]
        vector = _word_vector(encoded, self.word, self.pooling)
        if vector is None:
            raise LmlabError(f"the query {sentence!r} does not contain the word {self.word!r}",
                             "use a query sentence that contains the indexed word")
        vector = torch.nn.functional.normalize(vector, dim=-1)  # (H,) or (L+1, H)
        return (self.vectors * vector).sum(-1)

    def query(self, sentence: str, k: int = 5) -> list[Neighbour]:
        """The ``k`` occurrences nearest to ``word`` as used in ``sentence`` (the query sentence
        itself excluded)."""
        if self.all_layers:
            raise LmlabError("this index holds every layer", "use query_by_layer(sentence)")
        return self._nearest(self._scores(sentence), sentence, k)

    def query_by_layer(self, sentence: str, k: int = 5) -> list[list[Neighbour]]:
        """The ``k`` nearest occurrences at each hidden state (0 = embeddings ... top) of an
        index built with ``layer="all"``."""
        if not self.all_layers:
            raise LmlabError("this index holds one layer", 'build it with layer="all"')
        scores = self._scores(sentence)  # (N, L+1)
        return [self._nearest(scores[:, layer], sentence, k) for layer in range(scores.shape[1])]

    def _nearest(self, scores: torch.Tensor, sentence: str, k: int) -> list[Neighbour]:
        order = scores.argsort(descending=True, stable=True).tolist()
        hits = [Neighbour(float(scores[i]), self.sentences[i], self.word) for i in order
                if self.sentences[i].strip() != sentence.strip()]
        return hits[:k]


class StaticWordVectors:
    """Context-free word vectors: the mean of the word's pieces' rows of the input embedding
    table. Every occurrence of a word gets the same vector, whatever its sense."""

    def __init__(self, model, tokenizer):
        own = getattr(model, "token_vectors", None)  # recurrent models (ELMo: its char CNN)
        table = own() if own is not None else model.transformer.embeddings.word_embeddings.weight
        self.table = table.detach().float()
        self.tokenizer = tokenizer

    def vector(self, word: str) -> torch.Tensor:
        ids = self.tokenizer.encode(word, add_special_tokens=False)
        if not ids:
            raise LmlabError(f"{word!r} has no tokens", "use a non-empty word")
        return self.table[ids].mean(0)

    def nearest_words(self, word: str, k: int = 8) -> list[tuple[str, float]]:
        """Nearest vocabulary entries to the word's static vector (one list for every sense)."""
        vector = torch.nn.functional.normalize(self.vector(word), dim=-1)
        table = torch.nn.functional.normalize(self.table, dim=-1)
        scores = table @ vector
        special = set(self.tokenizer.all_special_ids)
        own = set(self.tokenizer.encode(word, add_special_tokens=False))
        result = []
        for index in scores.argsort(descending=True).tolist():
            if index in special or index in own:
                continue
            token = self.tokenizer.convert_ids_to_tokens(index)
            if token and not token.startswith("##") and token.isalpha():
                result.append((token, float(scores[index])))
            if len(result) >= k:
                break
        return result
