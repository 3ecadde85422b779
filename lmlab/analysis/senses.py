"""Word senses by layer: which layer of an encoder separates a word's senses best? The ELMo
paper's measurement (Peters et al. 2018, table 5) on WordNet 3.0: every lemma whose example
sentences fall in two or more of its synsets gives labelled occurrences; one example of each
sense that has two or more is held out for test. Each occurrence is the mean of its word's pieces
at every layer; a test occurrence gets the sense of its lemma's nearest train centroid (cosine)
or nearest train occurrence (1-NN), against the most frequent sense and a GloVe context-window
baseline. Split, baselines and scoring: docs/senses.md.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmlab.analysis.report import pyplot, save_png
from lmlab.metrics.classification import prf_from_counts
from lmlab.utils.checks import check_names
from lmlab.utils.errors import LmlabError
from lmlab.vectors.keyed import WordVectors, glove_6b_50d

POS_NAMES = {"n": "noun", "v": "verb", "a": "adjective", "r": "adverb"}
_SS_TYPE = {"1": "n", "2": "v", "3": "a", "4": "r", "5": "a"}  # sense-key digit -> pos


@dataclass(frozen=True)
class SenseExample:
    """One occurrence of ``lemma`` (``pos``) in sense ``sense`` (a synset id such as
    ``n02084071``) at characters ``span`` of ``sentence``."""

    lemma: str
    pos: str
    sense: str
    sentence: str
    span: tuple[int, int]

    @property
    def key(self) -> tuple[str, str]:
        return (self.lemma, self.pos)


# -- data: WordNet's example sentences, split, sense frequencies -----------------------------------
def sense_examples(pos: Sequence[str] = ("n", "v", "a", "r"), max_lemmas: int | None = None,
                   folder: Path | None = None) -> list[SenseExample]:
    """Occurrences of every lemma (of the parts of speech ``pos``) whose WordNet examples fall in
    two or more of its synsets, sorted by lemma, pos, sense, sentence. ``max_lemmas`` keeps that
    many lemmas, picked by hash (the same ones on every machine)."""
    from lmlab.tasks.builtin import hash_unit, wic_occurrences
    from lmlab.text.sources import wordnet

    folder = folder or wordnet.wordnet_dir()
    groups = wic_occurrences(wordnet.read_synsets(folder), wordnet.read_exceptions(folder))
    keys = sorted(k for k, senses in groups.items() if k[1] in pos and len(senses) >= 2)
    if max_lemmas is not None:
        keys = sorted(sorted(keys, key=lambda k: hash_unit(f"wsd-lemma:{k[0]}|{k[1]}"))[:max_lemmas])
    examples = [SenseExample(lemma, p, sense, occ["sentence"], tuple(occ["span"]))
                for lemma, p in keys for sense in sorted(groups[(lemma, p)])
                for occ in sorted(groups[(lemma, p)][sense], key=lambda o: o["sentence"])]
    # An example sentence that WordNet lists under two senses of its lemma (55 occurrences,
    # e.g. "had ample food for the party") has no single right answer: dropped.
    senses_of = defaultdict(set)
    for example in examples:
        senses_of[(example.lemma, example.pos, example.sentence, example.span)].add(example.sense)
    examples = [e for e in examples if len(senses_of[(e.lemma, e.pos, e.sentence, e.span)]) == 1]
    senses_left = defaultdict(set)  # a lemma that kept a single sense has nothing to tell apart
    for example in examples:
        senses_left[example.key].add(example.sense)
    return [e for e in examples if len(senses_left[e.key]) >= 2]


def split_examples(examples: Sequence[SenseExample]) -> tuple[list[int], list[int]]:
    """(train, test) indices: of every sense with two or more examples, the one with the lowest
    hash of its sentence (and the word's position in it) is held out for test; everything else is
    train. So every test sense has a train example, senses seen once stay in train as
    distractors, and the split of a sense does not depend on which other lemmas are sampled."""
    from lmlab.tasks.builtin import hash_unit

    by_sense: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for index, example in enumerate(examples):
        by_sense[(example.lemma, example.pos, example.sense)].append(index)
    test = set()
    for (lemma, pos, sense), indices in by_sense.items():
        if len(indices) >= 2:
            test.add(min(indices, key=lambda i: hash_unit(
                f"wsd:{lemma}|{pos}|{sense}|{examples[i].sentence}|{examples[i].span}")))
    return [i for i in range(len(examples)) if i not in test], sorted(test)


def sense_ranks(folder: Path | None = None) -> dict[tuple[str, str, str], int]:
    """``{(lemma, pos, synset id): sense number}`` from WordNet's ``index.sense`` (1 = the
    lemma's most frequent sense in WordNet's tagged corpus)."""
    from lmlab.utils.paths import find_system_path

    path = (folder / "index.sense") if folder else find_system_path("usr/share/wordnet/index.sense")
    if path is None or not path.is_file():
        raise LmlabError("WordNet's index.sense (sense frequencies) is not installed",
                         "install the Debian package wordnet-base (apt-get install wordnet-base)")
    ranks: dict[tuple[str, str, str], int] = {}
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            parts = line.split()
            if len(parts) < 3:
                continue
            lemma, _, rest = parts[0].partition("%")
            pos = _SS_TYPE.get(rest[:1])
            if pos is not None:
                ranks[(lemma.replace("_", " ").lower(), pos, f"{pos}{parts[1]}")] = int(parts[2])
    return ranks


# -- classifiers -------------------------------------------------------------------------------
def _by_lemma(examples: Sequence[SenseExample], indices: Sequence[int]) -> dict[tuple, list[int]]:
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i in indices:
        groups[examples[i].key].append(i)
    return groups


def _classify(examples: Sequence[SenseExample], train: Sequence[int], test: Sequence[int],
              choose: Callable[[list[int], list[int]], list[str]]) -> list[str | None]:
    """Predictions for ``test`` (None where the lemma has no train example): ``choose(train of
    the lemma, test of the lemma)`` picks the senses of the lemma's test examples."""
    trained = _by_lemma(examples, train)
    position = {index: n for n, index in enumerate(test)}
    predictions: list[str | None] = [None] * len(test)
    for key, indices in _by_lemma(examples, test).items():
        if key in trained:
            for index, sense in zip(indices, choose(trained[key], indices)):
                predictions[position[index]] = sense
    return predictions


def _unit(vectors: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(vectors.float(), dim=-1)


def nearest_centroid(examples: Sequence[SenseExample], vectors: torch.Tensor,
                     train: Sequence[int], test: Sequence[int]) -> list[str | None]:
    """Sense of the most cosine-similar train centroid of the same lemma. ``vectors`` (N, D),
    one row per example; a centroid is the mean of the raw train vectors of one sense."""
    def choose(train_of: list[int], test_of: list[int]) -> list[str]:
        senses = sorted({examples[i].sense for i in train_of})
        centroids = torch.stack([vectors[[i for i in train_of if examples[i].sense == s]].mean(0)
                                 for s in senses])  # (S, D)
        scores = _unit(vectors[test_of]) @ _unit(centroids).T  # (m, S)
        return [senses[j] for j in scores.argmax(-1).tolist()]

    return _classify(examples, train, test, choose)


def nearest_neighbour(examples: Sequence[SenseExample], vectors: torch.Tensor,
                      train: Sequence[int], test: Sequence[int]) -> list[str | None]:
    """Sense of the most cosine-similar train example of the same lemma (1-NN)."""
    def choose(train_of: list[int], test_of: list[int]) -> list[str]:
        scores = _unit(vectors[test_of]) @ _unit(vectors[train_of]).T  # (m, n)
        return [examples[train_of[j]].sense for j in scores.argmax(-1).tolist()]

    return _classify(examples, train, test, choose)


def most_frequent_sense(examples: Sequence[SenseExample], train: Sequence[int],
                        test: Sequence[int], ranks: dict[tuple[str, str, str], int]
                        ) -> list[str | None]:
    """Of the senses of the lemma that have train examples, the one WordNet ranks first (lowest
    sense number; unranked senses last, ties by synset id)."""
    def choose(train_of: list[int], test_of: list[int]) -> list[str]:
        senses = {examples[i].sense for i in train_of}
        lemma, pos = examples[train_of[0]].key
        best = min(senses, key=lambda s: (ranks.get((lemma, pos, s), 10**9), s))
        return [best] * len(test_of)

    return _classify(examples, train, test, choose)


def score(predictions: Sequence[str | None], gold: Sequence[str]) -> dict[str, float]:
    """Micro precision (correct / predicted), recall (correct / all) and their F1."""
    answered = sum(p is not None for p in predictions)
    correct = sum(p is not None and p == g for p, g in zip(predictions, gold))
    precision, recall, f1 = prf_from_counts(correct, answered, len(gold))
    return {"precision": precision, "recall": recall, "f1": f1, "correct": correct,
            "answered": answered, "total": len(gold)}


# -- representations -----------------------------------------------------------------------------
def context_vector(vectors: WordVectors, sentence: str, span: tuple[int, int], window: int = 5
                   ) -> np.ndarray:
    """Mean static vector of up to ``window`` words on each side of ``span`` in ``sentence``
    (the target's own words excluded; words are lower-cased, as GloVe's are; words without a
    vector skipped; zeros if none is left): the context-window baseline of WSD."""
    from lmlab.text.sources.wordnet import tokenize_with_spans

    tokens = tokenize_with_spans(sentence)
    before = [w for w, s, e in tokens if e <= span[0]][-window:] if window else []
    after = [w for w, s, e in tokens if s >= span[1]][:window] if window else []
    found = [v for v in (vectors.vector(w.lower()) for w in before + after) if v is not None]
    return np.mean(found, axis=0) if found else np.zeros(vectors.dim, np.float32)


def target_vectors(model, tokenizer, examples: Sequence[SenseExample], batch_size: int = 32
                   ) -> tuple[torch.Tensor, list[int]]:
    """(vectors (N', L+1, H), kept indices): per example the mean of the pieces overlapping its
    span, for every hidden state (:func:`lmlab.analysis.layer_cache.extract_word_features`: each
    distinct sentence runs through the model once, one forward pass giving every layer).
    Examples whose target was cut off by truncation are left out (missing from ``kept``)."""
    from lmlab.analysis.layer_cache import extract_word_features, word_rows

    requests, row_of = word_rows((example.sentence, example.span) for example in examples)
    out = np.zeros((len(row_of), model.config.num_hidden_layers + 1, model.config.hidden_size),
                   dtype=np.float32)  # (rows, L+1, H)
    valid = np.ones(len(row_of), dtype=bool)
    extract_word_features(model, tokenizer, requests, out, batch_size, valid=valid)
    rows = [row_of[(example.sentence, example.span)] for example in examples]
    kept = [index for index, row in enumerate(rows) if valid[row]]
    if not kept:
        raise LmlabError("no example's target word survived tokenization",
                         "check the model's tokenizer and maximum length")
    return torch.from_numpy(out[[rows[i] for i in kept]]), kept


# -- the measurement -----------------------------------------------------------------------------
@dataclass
class WsdReport:
    """F1 per layer of nearest-centroid and 1-NN sense classification, and the baselines."""

    model: str
    layers: list[dict[str, Any]]  # {"layer": i, "centroid": score, "nearest": score}
    baselines: dict[str, dict[str, float]]
    counts: dict[str, int]
    settings: dict[str, Any] = field(default_factory=dict)

    def best_layer(self, method: str = "centroid") -> int:
        """The layer with the highest F1 (the lowest layer on ties)."""
        return max(self.layers, key=lambda row: (row[method]["f1"], -row["layer"]))["layer"]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "best_layer": {m: self.best_layer(m)
                                               for m in ("centroid", "nearest")}}

    def table(self) -> str:
        """The report as a text table (F1 x 100)."""
        lines = [f"word senses by layer: {self.model}",
                 f"{self.counts['lemmas']} lemmas, {self.counts['senses']} senses, "
                 f"{self.counts['train']} train / {self.counts['test']} test examples",
                 "", f"{'layer':<28}{'centroid F1':>12}{'1-NN F1':>10}"]
        for row in self.layers:
            name = "0 (embeddings)" if row["layer"] == 0 else str(row["layer"])
            lines.append(f"{name:<28}{100 * row['centroid']['f1']:>12.1f}"
                         f"{100 * row['nearest']['f1']:>10.1f}")
        for name, result in self.baselines.items():
            lines.append(f"{name:<28}{100 * result['f1']:>12.1f}")
        lines.append(f"best layer: {self.best_layer('centroid')} (centroid), "
                     f"{self.best_layer('nearest')} (1-NN)")
        return "\n".join(lines)

    def plot(self, path: str | Path) -> None:
        """F1 per layer (both classifiers), baselines as horizontal lines, written as a PNG."""
        plt = pyplot()
        layers = [row["layer"] for row in self.layers]
        fig, ax = plt.subplots(figsize=(6, 4))
        for method, label in (("centroid", "nearest centroid"), ("nearest", "1-NN")):
            ax.plot(layers, [100 * row[method]["f1"] for row in self.layers], marker="o",
                    label=label)
        for (name, result), style in zip(self.baselines.items(), ("--", ":", "-.")):
            ax.axhline(100 * result["f1"], linestyle=style, color="grey", label=name)
        ax.set_xticks(layers)
        ax.set_xlabel("layer (0 = embeddings)")
        ax.set_ylabel("F1 (micro)")
        ax.set_title(f"WordNet senses by layer: {self.model}", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        save_png(fig, path, dpi=120)


def wsd_by_layer(model, tokenizer, pos: Sequence[str] = ("n", "v", "a", "r"),
                 max_lemmas: int | None = None, window: int = 5, batch_size: int = 32,
                 static_baseline: bool = True, name: str = "model") -> WsdReport:
    """Classify held-out WordNet occurrences by each layer's vectors (docs/senses.md).

    Example:
        >>> report = wsd_by_layer(model, tok, pos=("n", "v"), max_lemmas=200)
        >>> print(report.table()); report.best_layer("centroid")
    """
    check_names(list(pos), list(POS_NAMES), "--pos", "part of speech")
    if static_baseline:
        glove_6b_50d()  # a missing package is refused before the model runs
    ranks = sense_ranks()  # a missing index.sense is refused before the model runs
    examples = sense_examples(pos, max_lemmas)
    if not examples:
        raise LmlabError("no WordNet lemma has examples in two senses for these settings",
                         "use more lemmas (--max-lemmas) or more parts of speech (--pos)")
    vectors, kept = target_vectors(model, tokenizer, examples, batch_size)
    dropped = len(examples) - len(kept)
    examples = [examples[i] for i in kept]
    train, test = split_examples(examples)
    gold = [examples[i].sense for i in test]
    rows = []
    for layer in range(vectors.shape[1]):
        layer_vectors = vectors[:, layer]  # (N, H)
        rows.append({"layer": layer,
                     "centroid": score(nearest_centroid(examples, layer_vectors, train, test),
                                       gold),
                     "nearest": score(nearest_neighbour(examples, layer_vectors, train, test),
                                      gold)})
    baselines = {"most frequent sense": score(most_frequent_sense(
        examples, train, test, ranks), gold)}
    if static_baseline:
        static = torch.from_numpy(np.stack([context_vector(glove_6b_50d(), e.sentence, e.span, window)
                                            for e in examples]))  # (N, 50)
        baselines[f"GloVe context (+-{window} words)"] = score(
            nearest_centroid(examples, static, train, test), gold)
    trained = {(examples[i].key, examples[i].sense) for i in train}
    counts = {"lemmas": len({e.key for e in examples}),
              "senses": len({(e.key, e.sense) for e in examples}),
              "examples": len(examples), "train": len(train), "test": len(test),
              "dropped_truncated": dropped,
              "unpredictable": sum((examples[i].key, examples[i].sense) not in trained
                                   for i in test)}
    return WsdReport(model=name, layers=rows, baselines=baselines, counts=counts,
                     settings={"pos": list(pos), "max_lemmas": max_lemmas, "window": window})
