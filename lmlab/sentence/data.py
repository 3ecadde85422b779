"""Resumable batch streams for sentence-encoder training: pairs (columns of first, then second
sentences, for one encoder pass), skip-thought's (previous, sentence, next) triples and
quick-thought's runs of consecutive sentences."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from lmlab.finetune.data import Feature, ResumableBatches, collate, pad_id_of
from lmlab.sentence.pairs import SentencePair
from lmlab.utils.errors import LmlabError


def encode_texts(tokenizer: Any, texts: Sequence[str], max_length: int) -> list[list[int]]:
    """Token ids (special tokens included) of each text, cut to ``max_length``."""
    return tokenizer(list(texts), truncation=True, max_length=max_length)["input_ids"]


def collate_columns(columns: Sequence[Sequence[Sequence[int]]], labels: Sequence[int],
                    groups: Sequence[int], pad_id: int) -> dict[str, torch.Tensor]:
    """One padded batch of C columns of B sentences (rows ``[c * B, (c + 1) * B)`` are column
    ``c``); ``labels`` (B,), ``groups`` (C * B,)."""
    return {**padded_rows([row for column in columns for row in column], pad_id),
            "labels": torch.tensor(list(labels), dtype=torch.long),
            "groups": torch.tensor(list(groups), dtype=torch.long)}


def padded_rows(rows: Sequence[Sequence[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded (N, T) ``input_ids``, their ``attention_mask`` and zero
    ``token_type_ids``: fine-tuning's collate of features without labels."""
    batch = collate([Feature(list(row), None) for row in rows], pad_id)
    return {**batch, "token_type_ids": torch.zeros_like(batch["input_ids"])}


def _shuffled_batches(count: int, batch_size: int, seed: int, epoch: int,
                      minimum: int = 1) -> list[list[int]]:
    order = list(range(count))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    batches = [order[i:i + batch_size] for i in range(0, count, batch_size)]
    return [b for b in batches if len(b) >= minimum]


class SentenceStream(ResumableBatches):
    """What every sentence stream shares: tokenizer, sizes, seed and pad id (the tokenizer's,
    else 0)."""

    def __init__(self, tokenizer: Any, batch_size: int, max_length: int, seed: int = 0):
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_length = max_length
        self.seed = seed
        self.pad_id = pad_id_of(tokenizer)

    def padded(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        """:func:`padded_rows` of ``texts``, each cut to ``max_length`` tokens."""
        return padded_rows(encode_texts(self.tokenizer, texts, self.max_length), self.pad_id)


def triplets_of(pairs: Sequence[SentencePair]) -> list[SentencePair]:
    """Label-1 pairs with a ``negative``: their own, else the second sentences of the label-0
    pairs of the same first sentence, in turn (a WordNet pair folder's example, gloss and
    other sense)."""
    negatives: dict[str, list[str]] = {}
    for p in pairs:
        if p.label == 0:
            negatives.setdefault(p.sentence1, []).append(p.sentence2)
    rows, used = [], dict.fromkeys(negatives, 0)
    for p in pairs:
        if p.label != 1 or not (p.negative or negatives.get(p.sentence1)):
            continue
        if not p.negative:
            choices = negatives[p.sentence1]
            p = replace(p, negative=choices[used[p.sentence1] % len(choices)])
            used[p.sentence1] += 1
        rows.append(p)
    return rows


class PairStream(SentenceStream):
    """Endless shuffled batches of pairs (``positives_only``: label-1 pairs, the contrastive
    objective's input; ``triplets``: (first, second, negative) columns of :func:`triplets_of`).
    ``scores`` (B,) is each pair's score, else its label."""

    def __init__(self, pairs: Sequence[SentencePair], tokenizer: Any, batch_size: int,
                 max_length: int, seed: int = 0, positives_only: bool = False,
                 triplets: bool = False):
        if triplets:
            rows = triplets_of(pairs)
            if not rows:
                raise LmlabError("no triplet: no label-1 pair has a negative (its own "
                                 "`negative` or a label-0 pair of the same sentence1)",
                                 "give pairs with a `negative` field, or label-0 pairs beside "
                                 "the label-1 pairs of each first sentence")
        else:
            rows = [p for p in pairs if p.label == 1] if positives_only else list(pairs)
        self.triplets = triplets
        if len(rows) < 2:
            raise LmlabError(f"{len(rows)} usable pair(s)" + (" with label 1" if positives_only
                                                              else ""),
                             "give at least two pairs (in-batch negatives need two per batch)")
        if batch_size < 2:
            raise LmlabError(f"batch size {batch_size}", "use at least 2 pairs a batch")
        self.pairs = rows
        super().__init__(tokenizer, batch_size, max_length, seed)
        groups = sorted({p.group for p in rows})
        self.group_index = {g: i for i, g in enumerate(groups)}

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        return _shuffled_batches(len(self.pairs), self.batch_size, self.seed, epoch, minimum=2)

    def make_batch(self, indices: list[int]) -> dict[str, torch.Tensor]:
        chosen = [self.pairs[i] for i in indices]
        first = encode_texts(self.tokenizer, [p.sentence1 for p in chosen], self.max_length)
        second = encode_texts(self.tokenizer, [p.sentence2 for p in chosen], self.max_length)
        # the first column's groups never match a candidate: -1 - row
        groups = [-1 - i for i in range(len(chosen))] + [self.group_index[p.group]
                                                          for p in chosen]
        columns = [first, second]
        if self.triplets:
            columns.append(encode_texts(self.tokenizer, [p.negative for p in chosen],
                                        self.max_length))
            groups += [-1 - len(chosen) - i for i in range(len(chosen))]  # matched by none
        batch = collate_columns(columns, [p.label for p in chosen], groups, self.pad_id)
        batch["scores"] = torch.tensor([float(p.label) if p.score is None else p.score
                                        for p in chosen])
        return batch


def corpus_documents(corpus: str | Path, split: str = "train",
                     max_sentences: int | None = None) -> list[list[str]]:
    """The sentences of each document of a corpus split (at most ``max_sentences`` in all)."""
    from lmlab.text.corpus import read_corpus

    documents, total = [], 0
    for document in read_corpus(corpus, split):
        sentences = [s for s in document.sentences if s.strip()]
        if max_sentences is not None:
            sentences = sentences[:max_sentences - total]
        if sentences:
            documents.append(sentences)
            total += len(sentences)
        if max_sentences is not None and total >= max_sentences:
            break
    return documents


class TripleStream(SentenceStream):
    """Shuffled batches of (previous, sentence, next) triples, all three from one document."""

    def __init__(self, documents: Sequence[Sequence[str]], tokenizer: Any, batch_size: int,
                 max_length: int, seed: int = 0):
        self.documents = documents
        self.triples = [(d, i) for d, sentences in enumerate(documents)
                        for i in range(1, len(sentences) - 1)]
        if not self.triples:
            longest = max((len(s) for s in documents), default=0)
            raise LmlabError(f"no sentence with a previous and a next sentence in its document "
                             f"(the longest document has {longest} sentence(s))",
                             "give a corpus whose documents have three or more sentences")
        super().__init__(tokenizer, batch_size, max_length, seed)

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        return _shuffled_batches(len(self.triples), self.batch_size, self.seed, epoch)

    def make_batch(self, indices: list[int]) -> dict[str, torch.Tensor]:
        def column(offset: int) -> dict[str, torch.Tensor]:
            return self.padded([self.documents[d][i + offset]
                                for d, i in (self.triples[k] for k in indices)])

        previous, following = column(-1), column(1)
        return {**column(0), "prev_ids": previous["input_ids"],
                "prev_mask": previous["attention_mask"], "next_ids": following["input_ids"],
                "next_mask": following["attention_mask"]}


class ContiguousStream(SentenceStream):
    """Shuffled runs of consecutive sentences; ``document`` (B,) tells which are neighbours."""

    def __init__(self, documents: Sequence[Sequence[str]], tokenizer: Any, batch_size: int,
                 max_length: int, seed: int = 0):
        self.sentences = [s for sentences in documents for s in sentences]
        self.document = [d for d, sentences in enumerate(documents) for _ in sentences]
        if batch_size < 3:
            raise LmlabError(f"batch size {batch_size}",
                             "use at least 3 (a sentence, its neighbours and other candidates)")
        if not any(len(s) >= 2 for s in documents):
            raise LmlabError("no document has two sentences: no sentence has a neighbour",
                             "give a corpus whose documents have several sentences")
        if len(self.sentences) < batch_size:
            raise LmlabError(f"{len(self.sentences)} sentences, fewer than one batch of "
                             f"{batch_size}", "lower --batch-size or give a larger corpus")
        super().__init__(tokenizer, batch_size, max_length, seed)

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        starts = list(range(0, len(self.sentences) - self.batch_size + 1, self.batch_size))
        random.Random(f"{self.seed}:{epoch}").shuffle(starts)
        return [list(range(s, s + self.batch_size)) for s in starts]

    def make_batch(self, indices: list[int]) -> dict[str, torch.Tensor]:
        return {**self.padded([self.sentences[i] for i in indices]),
                "document": torch.tensor([self.document[i] for i in indices], dtype=torch.long)}
