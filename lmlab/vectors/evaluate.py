"""Intrinsic evaluation of word vectors: word similarity (Spearman and Pearson correlation of
cosines with human scores: WordSim-353, SimLex-999) and analogies (3CosAdd, 3CosMul; accuracy
per section of the Google set).

The conventions are gensim's ``evaluate_word_pairs`` / ``evaluate_word_analogies``, so the
numbers compare: only the first ``restrict_vocab`` words take part, matching is
case-insensitive (a word's first case variant stands for it), and items with an unknown word
are counted (``oov``), not scored. The sets are the files gensim ships as test data, read
without importing gensim; docs/vectors.md ("Evaluation") has the details and measurements.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lmlab.metrics.classification import pearson, spearman
from lmlab.utils.checks import check_at_least, check_choice, check_names, check_output_file
from lmlab.utils.errors import LmlabError
from lmlab.vectors.keyed import WordVectors

SIMILARITY_SETS = {"wordsim353": "wordsim353.tsv", "simlex999": "simlex999.txt"}
ANALOGY_SETS = {"google": "questions-words.txt"}
ANALOGY_METHODS = ("3cosadd", "3cosmul")


def evaluation_file(name_or_path: str | Path) -> Path:
    """The file of a named evaluation set (``wordsim353``, ``simlex999``, ``google``) or the
    path itself when it is a file."""
    from lmlab.utils.paths import package_file

    known = {**SIMILARITY_SETS, **ANALOGY_SETS}
    if str(name_or_path) in known:
        path = package_file("gensim", f"gensim/test/test_data/{known[str(name_or_path)]}")
        if path is None:
            raise LmlabError(f"the {name_or_path} set is not installed (it ships with gensim's "
                             "test data)", "pip install gensim (make setup does), or give the "
                             "path of a file in the same format")
        return path
    path = Path(name_or_path)
    if not path.is_file():
        raise LmlabError(f"no evaluation set named or found at {name_or_path!r}",
                         f"use one of {sorted(known)} or the path of a file")
    return path


class _Vocabulary:
    """gensim's view of the vocabulary for evaluation: the first ``restrict_vocab`` words, keyed
    by upper case when case-insensitive (the first variant wins)."""

    def __init__(self, vectors: WordVectors, restrict_vocab: int, case_insensitive: bool):
        check_at_least(restrict_vocab, 1, "restrict_vocab")
        self.size = min(restrict_vocab, len(vectors))
        self.case_insensitive = case_insensitive
        self.rows: dict[str, int] = {}
        for row, word in enumerate(vectors.words[:self.size]):
            self.rows.setdefault(self.key(word), row)
        self.unit = vectors.unit_rows(self.size)  # (V', D)

    def key(self, word: str) -> str:
        return word.upper() if self.case_insensitive else word


@dataclass
class SimilarityResult:
    """Correlations with human judgements on ``pairs`` scored pairs; ``oov`` pairs skipped."""

    dataset: str
    spearman: float
    pearson: float
    pairs: int
    oov: int

    @property
    def oov_ratio(self) -> float:
        return self.oov / (self.pairs + self.oov)


def evaluate_similarity(vectors: WordVectors, dataset: str | Path = "wordsim353",
                        restrict_vocab: int = 300_000, case_insensitive: bool = True
                        ) -> SimilarityResult:
    """Spearman and Pearson correlation of cosine similarities with the human scores of
    ``dataset`` (a name of :data:`SIMILARITY_SETS` or a file of ``word<TAB>word<TAB>score``
    lines; ``#`` starts a comment)."""
    path = evaluation_file(dataset)
    vocabulary = _Vocabulary(vectors, restrict_vocab, case_insensitive)
    gold, model, oov = [], [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line or line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) != 3:
            continue
        try:
            score = float(parts[2])
        except ValueError:
            continue
        rows = [vocabulary.rows.get(vocabulary.key(w)) for w in parts[:2]]
        if None in rows:
            oov += 1
            continue
        gold.append(score)
        model.append(float(vocabulary.unit[rows[0]] @ vocabulary.unit[rows[1]]))
    if len(gold) < 2:
        raise LmlabError(f"{len(gold)} pairs of {path.name} have vectors ({oov} have a word "
                         "outside the vocabulary)", "check the file's format "
                         "(word<TAB>word<TAB>score) and the vectors' language and case")
    name = str(dataset) if str(dataset) in SIMILARITY_SETS else path.name
    return SimilarityResult(name, spearman(gold, model), pearson(gold, model), len(gold), oov)


@dataclass
class AnalogyResult:
    """Accuracy of ``method`` per section (``{section: (correct, scored)}``); ``oov`` questions
    skipped. ``accuracy`` is over every scored question."""

    method: str
    sections: dict[str, tuple[int, int]] = field(default_factory=dict)
    oov: int = 0

    @property
    def correct(self) -> int:
        return sum(c for c, _ in self.sections.values())

    @property
    def scored(self) -> int:
        return sum(n for _, n in self.sections.values())

    @property
    def accuracy(self) -> float:
        return self.correct / self.scored if self.scored else float("nan")

    def section_accuracy(self, section: str) -> float:
        correct, scored = self.sections[section]
        return correct / scored if scored else float("nan")


def read_analogies(path: Path) -> list[tuple[str, list[list[str]]]]:
    """``[(section, [[a, b, c, expected], ...]), ...]`` from a ``: section`` / ``a b c d`` file."""
    sections: list[tuple[str, list[list[str]]]] = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.startswith(": "):
            sections.append((line[2:].strip(), []))
            continue
        words = line.split()
        if len(words) != 4:
            continue
        if not sections:
            raise LmlabError(f"{path}:{line_no} is a question before any ': section' line",
                             "start the file with a section header such as ': capitals'")
        sections[-1][1].append(words)
    return sections


def evaluate_analogies(vectors: WordVectors, dataset: str | Path = "google",
                       method: str = "3cosadd", restrict_vocab: int = 300_000,
                       case_insensitive: bool = True, batch_size: int = 128) -> AnalogyResult:
    """Answer every analogy question of ``dataset`` with ``method`` (3CosAdd or 3CosMul) among
    the first ``restrict_vocab`` words; accuracy per section. Questions are scored in batches:
    one (batch, V') matrix product per batch."""
    check_choice(method, ANALOGY_METHODS, "method", "analogy method")
    path = evaluation_file(dataset)
    vocabulary = _Vocabulary(vectors, restrict_vocab, case_insensitive)
    # every row that is the same word to the evaluation (its case variants), for excluding
    # the question's words from the answers and for mapping an answer to its canonical row
    same_word = np.array([vocabulary.rows[vocabulary.key(w)]
                          for w in vectors.words[:vocabulary.size]])
    variants: dict[int, list[int]] = {}
    for row, canonical in enumerate(same_word):
        variants.setdefault(int(canonical), []).append(row)
    result = AnalogyResult(method)
    for section, questions in read_analogies(path):
        known = []
        for words in questions:
            rows = [vocabulary.rows.get(vocabulary.key(w)) for w in words]
            if None in rows:
                result.oov += 1
            else:
                known.append(rows)
        correct = 0
        for start in range(0, len(known), batch_size):
            rows = np.asarray(known[start:start + batch_size])  # (Q, 4): a, b, c, expected
            answers = _answer(vocabulary.unit, rows[:, :3], method, variants)
            answers = same_word[answers]  # a case variant of the expected word counts
            correct += int((answers == rows[:, 3]).sum())
        result.sections[section] = (correct, len(known))
    if result.scored == 0:
        raise LmlabError(f"no question of {path.name} has all four words in the vocabulary "
                         f"({result.oov} skipped)", "check the vectors' language and case, or "
                         "raise restrict_vocab")
    return result


def _answer(unit: np.ndarray, questions: np.ndarray, method: str,
            variants: dict[int, list[int]]) -> np.ndarray:
    """The row answering each ``a : b :: c : ?`` question (rows of ``unit``, (Q, 3))."""
    a, b, c = (unit[questions[:, i]] for i in range(3))  # each (Q, D)
    if method == "3cosadd":
        scores = (b - a + c) @ unit.T  # (Q, V'): the ranking of cos(d, b - a + c)
    else:
        scores = b @ unit.T  # (Q, V') each term shifted to (1 + cos) / 2, in place
        scores += 1
        scores *= (c @ unit.T + 1) / 2
        scores /= (a @ unit.T + 1) + 2e-6  # 2 x ((1 + cos_a) / 2 + 1e-6)
    # an input word (or a case variant of one) is never the answer
    hidden = [(q, row) for q, words in enumerate(questions.tolist())
              for word in words for row in variants[word]]
    question_index, row_index = np.array(hidden).T
    scores[question_index, row_index] = -np.inf
    return scores.argmax(axis=1)


def evaluate_vectors_file(source: str, similarity: list[str], analogies: str | None,
                          methods: list[str], restrict_vocab: int = 300_000,
                          case_insensitive: bool = True, limit: int | None = None,
                          json_path: str | None = None, overwrite: bool = False) -> dict:
    """``lmlab vectors evaluate``: score the vectors of ``source`` (a file or ``glove-6b-50d``)
    on the ``similarity`` sets and the ``analogies`` set with each of ``methods``, print the
    scores and write them to ``json_path``; returns them. Every input is checked (the sets
    found) before the vectors load."""
    from lmlab.utils.io import atomic_write_json
    from lmlab.vectors.keyed import load_vectors

    check_names(methods, list(ANALOGY_METHODS), "--method", "analogy method")
    check_at_least(restrict_vocab, 1, "--restrict-vocab")
    check_at_least(limit, 1, "--limit")
    for dataset in [*similarity, *([analogies] if analogies else [])]:
        evaluation_file(dataset)
    if json_path:
        check_output_file(json_path, overwrite, "--json")
    vectors = load_vectors(source, limit=limit)
    print(f"{source}: {vectors}")
    scores: dict = {"vectors": str(source), "words": len(vectors), "dim": vectors.dim,
                    "restrict_vocab": restrict_vocab, "similarity": {}, "analogies": {}}
    for dataset in similarity:
        r = evaluate_similarity(vectors, dataset, restrict_vocab, case_insensitive)
        print(f"{r.dataset:<12} Spearman {r.spearman:.3f}  Pearson {r.pearson:.3f}  "
              f"({r.pairs} pairs, {r.oov} with unknown words)")
        scores["similarity"][r.dataset] = {"spearman": r.spearman, "pearson": r.pearson,
                                           "pairs": r.pairs, "oov": r.oov}
    for method in methods if analogies else []:
        r = evaluate_analogies(vectors, analogies, method, restrict_vocab, case_insensitive)
        print(f"{analogies} analogies, {method}: {100 * r.accuracy:.1f}% of {r.scored} "
              f"({r.oov} with unknown words)")
        for section, (correct, scored) in r.sections.items():
            share = f"{100 * correct / scored:5.1f}%" if scored else "    -"
            print(f"    {section:<30} {share} of {scored}")
        scores["analogies"][method] = {"accuracy": r.accuracy, "scored": r.scored, "oov": r.oov,
                                       "sections": {s: {"correct": c, "scored": n}
                                                    for s, (c, n) in r.sections.items()}}
    if json_path:
        atomic_write_json(json_path, scores)
        print(f"wrote {json_path}")
    return scores
