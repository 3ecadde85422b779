"""Clark et al.'s (2019, section 4.2) relation heads: for each dependency relation, how often one
attention head's most-attended other word is the dependent's syntactic head, against the best
fixed-offset baseline (docs/attention.md). The scoring follows the paper's published code
(clarkkev/attention-analysis, Syntax_Analysis.ipynb): word-level maps from token-level ones
(:func:`lmlab.analysis.attention.merge_to_words`), the prediction the most-attended word other
than the word itself and the special tokens, both directions (the dependent attending to its
head, and the transpose), the ``poss`` exception, and offsets -3..2 clamped to the sentence.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmlab.analysis.attention import merge_to_words, model_attentions
from lmlab.analysis.report import pyplot, save_png, write_files
from lmlab.models.inputs import input_limit, model_inputs
from lmlab.utils.errors import LmlabError

DIRECTIONS = ("dependent->head", "head->dependent")  # Clark's "dep->head" / "head<-dep"
CLARK_OFFSETS = (-3, -2, -1, 0, 1, 2)  # the published code's range(-3, 3)
POSSESSIVES = ("'s", "s'", "\u2019s")  # a poss dependent followed by one: read the 's's row
SKIPPED_RELATIONS = ("root", "punct")  # left out of the table, as in the paper


@dataclass
class ParsedSentence:
    """A sentence's words, each word's head (1-based word index, 0 for the root: the paper's
    convention) and its relation to it (lower case)."""

    words: list[str]
    heads: list[int]
    relations: list[str]


def parse_sentences(texts: Iterable[str], nlp: Any = None) -> list[ParsedSentence]:
    """spaCy's dependency parses of ``texts`` (silver: predicted, not annotated), whitespace
    tokens dropped; a text with several sentences keeps one root each."""
    from lmlab.tasks.probing import doc_words, load_spacy

    nlp = nlp or load_spacy()
    parsed = []
    for doc in nlp.pipe(list(texts), batch_size=256):
        spans, index = doc_words(doc)
        tokens = [t for t in doc if not t.is_space]
        if not spans or any(t.head.i not in index for t in tokens):
            continue
        parsed.append(ParsedSentence(
            words=[t.text for t in tokens],
            heads=[0 if t.head.i == t.i else index[t.head.i] + 1 for t in tokens],
            relations=[t.dep_.lower() for t in tokens]))
    return parsed


def sentence_word_maps(maps: torch.Tensor, word_ids: Sequence[int | None]) -> torch.Tensor:
    """Word-to-word maps (..., W, W) from one sentence's token maps (..., T, T): word ``w``'s
    pieces are the positions with ``word_ids[p] == w``, each other position (special tokens) a
    unit of its own; attention to a word summed over its pieces, from a word averaged (Clark's
    "mean"); then the rows and columns of the words only."""
    groups: list[list[int]] = []
    unit_of_word: dict[int, int] = {}
    for position, word in enumerate(word_ids):
        if word is None:
            groups.append([position])
        elif word in unit_of_word:
            groups[unit_of_word[word]].append(position)
        else:
            unit_of_word[word] = len(groups)
            groups.append([position])
    if sorted(unit_of_word) != list(range(len(unit_of_word))):
        raise LmlabError("a word has no token (the tokenizer dropped it)",
                         "leave such sentences out")
    words = [unit_of_word[w] for w in range(len(unit_of_word))]
    merged = merge_to_words(maps, groups, groups)  # (..., U, U) over every unit
    return merged[..., words, :][..., words]  # (..., W, W)


def attention_predictions(word_maps: np.ndarray) -> np.ndarray:
    """Each word's predicted head (1-based) per direction, layer and head: (2, L, H, W) from
    word maps (L, H, W, W), the most-attended word other than itself (the transpose: the word
    that attends to it most)."""
    maps = np.stack([word_maps, np.swapaxes(word_maps, -1, -2)]).astype(np.float64)
    n = maps.shape[-1]
    maps[..., np.arange(n), np.arange(n)] = 0.0
    return maps.argmax(-1) + 1  # 1-based: 0 is the root


def offset_predictions(num_words: int, offset: int) -> np.ndarray:
    """The baseline's heads: the word ``offset`` away, 0 (the root) before the first word and
    the last word past the end, as the published code clamps."""
    return np.array([max(0, min(i + offset + 1, num_words)) for i in range(num_words)])


def correct(predictions: np.ndarray, sentence: ParsedSentence) -> np.ndarray:
    """Whether each word's prediction (..., W) is its head, with the paper's ``poss`` rule: a
    possessor followed by 's is scored by the 's's prediction (BERT's heads attend from it)."""
    gold = np.asarray(sentence.heads)
    scored = predictions.copy()
    words = sentence.words
    for i, relation in enumerate(sentence.relations):
        if relation == "poss" and i + 1 < len(words) and words[i + 1].lower() in POSSESSIVES:
            scored[..., i] = predictions[..., i + 1]
    return scored == gold


@dataclass
class RelationHeads:
    """Counts behind Clark et al.'s Table 1: per relation, its words, each head's correct
    predictions (2 directions, L, H) and each offset's. ``all`` counts every word."""

    counts: dict[str, int] = field(default_factory=dict)
    hits: dict[str, np.ndarray] = field(default_factory=dict)
    baseline: dict[str, dict[int, int]] = field(default_factory=dict)
    sentences: int = 0
    skipped: int = 0
    sample: str = ""
    model: str = ""
    host: str = ""
    seconds: float = 0.0

    def add(self, sentence: ParsedSentence, word_maps: np.ndarray,
            offsets: Sequence[int] = CLARK_OFFSETS) -> None:
        """Score one sentence from its word maps (L, H, W, W)."""
        heads_right = correct(attention_predictions(word_maps), sentence)  # (2, L, H, W)
        offsets_right = {o: correct(offset_predictions(len(sentence.words), o), sentence)
                         for o in offsets}
        for i, relation in enumerate(sentence.relations):
            for name in ("all", relation):
                self.counts[name] = self.counts.get(name, 0) + 1
                self.hits[name] = self.hits.get(name, 0) + heads_right[..., i].astype(np.int64)
                row = self.baseline.setdefault(name, {})
                for offset, right in offsets_right.items():
                    row[offset] = row.get(offset, 0) + int(right[i])
        self.sentences += 1

    def best_head(self, relation: str) -> tuple[float, int, int, str]:
        """(accuracy, layer, head, direction) of the best head for ``relation``."""
        hits = self.hits[relation]
        direction, layer, head = np.unravel_index(int(hits.argmax()), hits.shape)
        return (float(hits[direction, layer, head]) / self.counts[relation], int(layer),
                int(head), DIRECTIONS[direction])

    def best_offset(self, relation: str) -> tuple[float, int]:
        """(accuracy, offset) of the best fixed offset for ``relation``."""
        offset, hits = max(self.baseline[relation].items(), key=lambda kv: (kv[1], kv[0]))
        return hits / self.counts[relation], offset

    def rows(self, min_count: int = 100) -> list[dict[str, Any]]:
        """The table: ``all``, then relations with at least ``min_count`` words, most frequent
        first (root and punct left out)."""
        names = ["all"] + sorted((r for r, n in self.counts.items() if n >= min_count
                                  and r not in ("all", *SKIPPED_RELATIONS)),
                                 key=lambda r: (-self.counts[r], r))
        rows = []
        for name in names:
            accuracy, layer, head, direction = self.best_head(name)
            base, offset = self.best_offset(name)
            rows.append({"relation": name, "count": self.counts[name], "layer": layer,
                         "head": head, "direction": direction, "accuracy": accuracy,
                         "baseline_offset": offset, "baseline": base})
        return rows

    def to_json(self, min_count: int = 100) -> dict[str, Any]:
        return {"model": self.model, "sample": self.sample, "sentences": self.sentences,
                "skipped": self.skipped, "host": self.host, "seconds": round(self.seconds, 1),
                "directions": DIRECTIONS, "table": self.rows(min_count),
                "counts": self.counts, "hits": {k: v.tolist() for k, v in self.hits.items()},
                "baseline": {k: {str(o): n for o, n in v.items()} for k, v in self.baseline.items()}}

    def to_markdown(self, min_count: int = 100) -> str:
        """Table 1's layout: per relation, the best head and the best offset."""
        lines = [f"Relation heads of {self.model} on {self.sentences} sentences ({self.sample}); "
                 "layer-head counted from 0.", "",
                 "| relation | words | best head | direction | accuracy | best offset | "
                 "baseline |", "|---|---|---|---|---|---|---|"]
        for row in self.rows(min_count):
            lines.append(f"| {row['relation']} | {row['count']} | {row['layer']}-{row['head']} | "
                         f"{row['direction']} | {100 * row['accuracy']:.1f} | "
                         f"{row['baseline_offset']:+d} | {100 * row['baseline']:.1f} |")
        return "\n".join(lines) + "\n"

    def plot(self, path: str | Path, min_count: int = 100, title: str = "") -> Path:
        """Per relation, the best head's accuracy beside the best offset's, as a PNG."""
        plt = pyplot()
        rows = self.rows(min_count)
        x = np.arange(len(rows))
        fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(rows) + 1.5), 3.8))
        ax.bar(x - 0.2, [100 * r["accuracy"] for r in rows], 0.4, label="best attention head")
        ax.bar(x + 0.2, [100 * r["baseline"] for r in rows], 0.4, label="best fixed offset")
        ax.set_xticks(x, [r["relation"] for r in rows], rotation=60, ha="right", fontsize=8)
        ax.set_ylabel("accuracy (%)")
        ax.set_ylim(0, 100)
        ax.legend(fontsize=8)
        ax.set_title(title or f"{self.model}: relation heads ({self.sentences} sentences)",
                     fontsize=10)
        fig.tight_layout()
        return save_png(fig, path, dpi=110)


def word_attention_maps(model: Any, tokenizer: Any, sentences: Sequence[ParsedSentence],
                        batch_size: int = 32, max_length: int | None = None
                        ) -> Iterator[tuple[int, np.ndarray]]:
    """(index, word maps (L, H, W, W)) of each sentence the model takes whole: its words are
    tokenized one by one (as the paper's code did), a sentence longer than the limit is left
    out."""
    limit = input_limit(model, tokenizer, max_length)
    for start in range(0, len(sentences), batch_size):
        chunk = sentences[start:start + batch_size]
        batch = tokenizer([s.words for s in chunk], is_split_into_words=True, padding=True,
                          padding_side="right", return_tensors="pt")
        maps = next(iter(model_attentions(model, **_inputs(model, batch)).values()))
        lengths = batch["attention_mask"].sum(-1).tolist()
        for row, sentence in enumerate(chunk):
            if limit is not None and lengths[row] > limit:
                continue
            word_ids = batch.word_ids(row)[:lengths[row]]
            if len({w for w in word_ids if w is not None}) != len(sentence.words):
                continue
            token_maps = maps[:, row, :, :lengths[row], :lengths[row]]  # (L, H, T, T)
            yield start + row, sentence_word_maps(token_maps, word_ids).numpy()


def _inputs(model: Any, batch: Any) -> dict[str, Any]:
    inputs = model_inputs(model, batch)
    return {k: inputs.get(k) for k in ("input_ids", "attention_mask", "token_type_ids")}


def relation_heads(model: Any, tokenizer: Any, sentences: Sequence[ParsedSentence],
                   batch_size: int = 32, max_length: int | None = None, sample: str = "",
                   name: str = "") -> RelationHeads:
    """Score every head of ``model`` on ``sentences`` (see :class:`RelationHeads`).

    Example:
        >>> parsed = parse_sentences(default_sample(2000))
        >>> print(relation_heads(model, tok, parsed, name="minilm").to_markdown())
    """
    if not sentences:
        raise LmlabError("no parsed sentence to score", "give at least one sentence")
    from lmlab.utils.host import describe_host

    started = time.perf_counter()
    result = RelationHeads(sample=sample, model=name, host=describe_host())
    for index, maps in word_attention_maps(model, tokenizer, sentences, batch_size, max_length):
        result.add(sentences[index], maps)
    result.skipped = len(sentences) - result.sentences
    if not result.sentences:
        raise LmlabError("every sentence was longer than the model takes",
                         "give shorter sentences or a larger --max-length")
    result.seconds = time.perf_counter() - started
    return result


def write_relation_heads(result: RelationHeads, out_dir: str | Path, min_count: int = 100
                         ) -> list[Path]:
    """``relation_heads.json``, ``.md`` and ``.png`` in ``out_dir``, each atomically."""
    return write_files(out_dir, {
        "relation_heads.json": result.to_json(min_count),
        "relation_heads.md": result.to_markdown(min_count),
        "relation_heads.png": lambda path: result.plot(path, min_count)})
