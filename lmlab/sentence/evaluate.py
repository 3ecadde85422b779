"""Evaluating sentence encoders on three offline sets: Lee document similarity (Pearson and
Spearman against human scores), WiC (one cosine threshold chosen on dev) and gloss retrieval
over held-out synsets. docs/sentence-encoders.md ("Evaluation") describes each.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.nn.functional import cosine_similarity

from lmlab.utils.checks import check_names
from lmlab.utils.errors import LmlabError

LEE_FILES = ("lee.cor", "similarities0-1.txt")
EVALUATIONS = ("lee", "wic", "retrieval")


def lee_folder(folder: str | Path | None = None) -> Path:
    """The folder holding the Lee files: ``folder``, else gensim's test data (not imported)."""
    if folder is None:
        spec = importlib.util.find_spec("gensim")
        if spec is None or not spec.submodule_search_locations:
            raise LmlabError("the Lee document-similarity files were not found (gensim's test "
                             "data is not installed)",
                             "pip install gensim (its test data holds lee.cor and "
                             "similarities0-1.txt), or pass --lee-dir FOLDER with those files")
        folder = Path(next(iter(spec.submodule_search_locations))) / "test" / "test_data"
    folder = Path(folder)
    missing = [name for name in LEE_FILES if not (folder / name).is_file()]
    if missing:
        raise LmlabError(f"{folder} has no {', '.join(missing)}",
                         "pass --lee-dir a folder with lee.cor and similarities0-1.txt")
    return folder


def read_lee(folder: str | Path | None = None) -> tuple[list[str], list[tuple[int, int, float]]]:
    """(50 documents, [(i, j, human score)] for i < j) of the Lee set."""
    folder = lee_folder(folder)
    documents = [line.strip() for line in
                 (folder / "lee.cor").read_text(encoding="utf-8", errors="replace").splitlines()
                 if line.strip()]
    rows = [[float(x) for x in line.split()] for line in
            (folder / "similarities0-1.txt").read_text(encoding="utf-8").splitlines()
            if line.strip()]
    if len(rows) != len(documents) or any(len(r) != len(documents) for r in rows):
        raise LmlabError(f"{folder}: {len(documents)} documents but a {len(rows)}-row score "
                         "matrix", "use the lee.cor and similarities0-1.txt of one release")
    pairs = [(i, j, rows[i][j]) for i in range(len(rows)) for j in range(i + 1, len(rows))]
    return documents, pairs


def lee_similarity(encoder: Any, folder: str | Path | None = None) -> dict[str, float]:
    """Pearson and Spearman (x100) of document cosines against the human scores."""
    from lmlab.metrics.classification import pearson, spearman

    documents, pairs = read_lee(folder)
    vectors = encoder.encode(documents)
    left = vectors[[i for i, _, _ in pairs]]
    right = vectors[[j for _, j, _ in pairs]]
    predicted = cosine_similarity(left, right).tolist()
    human = [score for _, _, score in pairs]
    return {"pearson": 100 * pearson(predicted, human), "spearman": 100 * spearman(predicted, human),
            "pairs": len(pairs)}


def best_threshold(scores: Sequence[float], labels: Sequence[int]) -> tuple[float, float]:
    """(threshold, accuracy) of the most accurate cut ``score >= threshold`` (a midpoint)."""
    ordered = sorted(zip(scores, labels))
    positives = sum(labels)
    best, best_correct = ordered[0][0] - 1.0, positives  # everything predicted 1
    correct = positives
    for k, (score, label) in enumerate(ordered):
        correct += 1 if label == 0 else -1  # item k now predicted 0
        if k + 1 < len(ordered) and ordered[k + 1][0] == score:
            continue  # no cut falls between equal scores: both sides get one prediction
        cut = (score + ordered[k + 1][0]) / 2 if k + 1 < len(ordered) else score + 1.0
        if correct > best_correct:
            best, best_correct = cut, correct
    return best, best_correct / len(ordered)


def wic_threshold(encoder: Any, size: str = "cpu") -> dict[str, float]:
    """Accuracy (x100) of a cosine threshold chosen on wordnet-wic dev, on dev and test."""
    from lmlab.tasks.builtin import load_builtin_task

    task = load_builtin_task("wordnet-wic", size=size)
    scored = {}
    for split in ("dev", "test"):
        examples = task.split(split)
        first = encoder.encode([e.text for e in examples])
        second = encoder.encode([e.text_pair for e in examples])
        labels = [1 if e.label == task.positive_label else 0 for e in examples]
        scored[split] = (cosine_similarity(first, second).tolist(), labels)
    threshold, dev_accuracy = best_threshold(*scored["dev"])
    test_scores, test_labels = scored["test"]
    test_accuracy = sum((s >= threshold) == bool(y) for s, y in zip(test_scores, test_labels))
    return {"threshold": threshold, "dev_accuracy": 100 * dev_accuracy,
            "test_accuracy": 100 * test_accuracy / len(test_labels), "test_pairs": len(test_labels)}


def gloss_retrieval(encoder: Any, pairs: str | Path | None = None, split: str = "test",
                    max_synsets: int | None = 1000, ks: Sequence[int] = (1, 5, 10)
                    ) -> dict[str, float]:
    """Precision@1 and recall@k (x100) of retrieving each example's own gloss among the
    held-out synsets' (the first ``max_synsets`` by id)."""
    from lmlab.sentence.pairs import build_wordnet_pairs, pair_file, read_pairs

    if pairs is not None:
        rows = read_pairs(pair_file(pairs, split))
    else:
        rows = build_wordnet_pairs(exclude_wic=False)[0][split]
    positives = [p for p in rows if p.label == 1]
    glosses: dict[str, str] = {}
    for pair in positives:
        glosses.setdefault(pair.group, pair.sentence2)
    groups = sorted(glosses)[:max_synsets] if max_synsets else sorted(glosses)
    if len(groups) < 2:
        raise LmlabError(f"{len(groups)} held-out gloss(es) to retrieve from",
                         "give a split with at least two synsets")
    index = {g: i for i, g in enumerate(groups)}
    queries = [p for p in positives if p.group in index]
    gloss_vectors = torch.nn.functional.normalize(encoder.encode([glosses[g] for g in groups]),
                                                  dim=-1)
    query_vectors = torch.nn.functional.normalize(encoder.encode([p.sentence1 for p in queries]),
                                                  dim=-1)
    scores = query_vectors @ gloss_vectors.T  # (Q, G)
    gold = torch.tensor([index[p.group] for p in queries])
    rank = (scores > scores[torch.arange(len(gold)), gold][:, None]).sum(-1)  # 0 = first
    results = {"precision@1": 100 * float((rank == 0).float().mean())}
    for k in ks:
        if k > 1:
            results[f"recall@{k}"] = 100 * float((rank < k).float().mean())
    results.update(queries=len(queries), glosses=len(groups))
    return results


def evaluate_encoder(encoder: Any, evaluations: Sequence[str] = EVALUATIONS,
                     lee_dir: str | Path | None = None, pairs: str | Path | None = None,
                     max_synsets: int | None = 1000, wic_size: str = "cpu") -> dict[str, Any]:
    """The chosen evaluations of ``encoder`` (a :class:`~lmlab.sentence.encoder.SentenceEncoder`)."""
    check_names(list(evaluations), EVALUATIONS, "--tasks", "evaluation")
    if "lee" in evaluations:
        lee_folder(lee_dir)  # refused before any encoding
    results: dict[str, Any] = {}
    if "lee" in evaluations:
        results["lee"] = lee_similarity(encoder, lee_dir)
    if "wic" in evaluations:
        results["wic"] = wic_threshold(encoder, wic_size)
    if "retrieval" in evaluations:
        results["retrieval"] = gloss_retrieval(encoder, pairs, max_synsets=max_synsets)
    return results
