"""Aligning two embedding spaces: orthogonal Procrustes from a seed dictionary, CSLS retrieval.

The orthogonal map W minimising ||X W - Y|| over the dictionary's pairs is ``U V^T`` for the
SVD ``U S V^T`` of ``X^T Y``; a held-out word is translated by its mapped vector's nearest
target word, by cosine or by CSLS (Conneau et al. 2018), which discounts hubs:
``CSLS(x, y) = 2 cos(Wx, y) - r_T(Wx) - r_S(y)``, ``r`` the mean cosine of the k nearest
neighbours in the other space. docs/vectors.md ("Alignment") has the method and measurements.

Example:
    >>> pairs = identical_word_pairs(ours, glove, top=5000)
    >>> report = align_spaces(ours, glove, pairs, test_fraction=0.2)
    >>> report.precision["csls"], report.precision["unaligned"]
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from scipy.linalg import orthogonal_procrustes

from lmlab.utils.checks import check_at_least, check_choice, check_file, check_output_file
from lmlab.utils.errors import LmlabError
from lmlab.utils.progress import progress
from lmlab.vectors.keyed import WordVectors, unit_rows

RETRIEVALS = ("nn", "csls")


def procrustes(source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The orthogonal (D, D) matrix W minimising ||source @ W - target|| over paired rows."""
    source, target = np.asarray(source, np.float64), np.asarray(target, np.float64)
    if source.shape != target.shape:
        raise LmlabError(f"paired vectors of shapes {source.shape} and {target.shape}",
                         "both spaces need the same dimension and one row per dictionary pair")
    return orthogonal_procrustes(source, target)[0].astype(np.float32)  # U V^T of the SVD


def least_squares(source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Mikolov et al. (2013)'s linear map: the (D, D) matrix W minimising ||source @ W - target||
    over paired rows, any matrix rather than a rotation (least squares)."""
    source, target = np.asarray(source, np.float64), np.asarray(target, np.float64)
    return np.linalg.lstsq(source, target, rcond=None)[0].astype(np.float32)


MAPPINGS = {"least-squares": least_squares, "procrustes": procrustes}


def centred_unit_rows(matrix: np.ndarray) -> np.ndarray:
    """Rows scaled to length 1, mean-centred, scaled again: the normalisation Artetxe et al.
    (2016, 2018) apply before mapping, so the dot products the map fits are cosines."""
    rows = unit_rows(np.asarray(matrix, np.float32))
    return unit_rows(rows - rows.mean(axis=0, keepdims=True))


def self_learning(source: np.ndarray, target: np.ndarray, seed: Sequence[tuple[int, int]],
                  retrieval: str = "nn", max_iterations: int = 50, tolerance: float = 1e-6,
                  k: int = 10) -> tuple[np.ndarray, list[float]]:
    """Artetxe et al. (2017)'s self-learning from a small seed dictionary of (source row,
    target row) pairs: fit the orthogonal map on the dictionary, then replace the dictionary
    by each source row's nearest target row under the map (``retrieval``), until the mean
    similarity of the induced pairs improves by less than ``tolerance``. Rows should be
    normalised (:func:`centred_unit_rows`). Returns the map and the objective per iteration."""
    check_choice(retrieval, RETRIEVALS, "retrieval", "retrieval")
    if not seed:
        raise LmlabError("the seed dictionary is empty", "give at least one (source, target) pair")
    rows, columns = np.array([s for s, _ in seed]), np.array([t for _, t in seed])
    history: list[float] = []
    for _ in range(max_iterations):
        mapping = procrustes(source[rows], target[columns])
        mapped = source @ mapping
        columns = retrieve(mapped, target, retrieval, k)
        rows = np.arange(len(source))
        history.append(float(np.einsum("ij,ij->i", unit_rows(mapped),
                                       unit_rows(target[columns])).mean()))
        if len(history) > 1 and history[-1] - history[-2] < tolerance:
            break
    return mapping, history


def _mean_top_k_rows(matrix: np.ndarray, k: int) -> np.ndarray:
    """The mean of each row's ``k`` largest values (torch's top-k: 3x numpy's partition here)."""
    return torch.from_numpy(matrix).topk(k, dim=1).values.mean(dim=1).numpy()


def _induce(scores: np.ndarray, scores_t: np.ndarray, keep: float, k: int,
            rng: np.random.Generator) -> tuple[float, np.ndarray, np.ndarray]:
    """One dictionary induction from the cosines ``scores`` (S, T) of mapped source rows with
    target rows (``scores_t`` its contiguous transpose): the objective (the mean best cosine,
    averaged over both directions), each source row's target and each target row's source,
    chosen by CSLS after dropping each similarity with probability ``1 - keep`` (Artetxe et
    al. 2018's stochastic induction, drawn apart for each direction). A query's own r(x) is
    constant along its row, so ranking by ``cos - r(y) / 2`` equals ranking by CSLS."""
    k = min(k, *scores.shape)
    objective = (scores.max(axis=1).mean() + scores_t.max(axis=1).mean()) / 2

    def choose(cosines: np.ndarray, hubness: np.ndarray) -> np.ndarray:
        csls = cosines - hubness[None, :] / 2
        if keep < 1.0:
            csls[rng.random(csls.shape, dtype=np.float32) >= keep] = -np.inf
        return csls.argmax(axis=1)

    forward = choose(scores, _mean_top_k_rows(scores_t, k))  # (S,) a target per source row
    backward = choose(scores_t, _mean_top_k_rows(scores, k))  # (T,) a source per target row
    return float(objective), forward, backward


def _whitening(matrix: np.ndarray) -> np.ndarray:
    """The symmetric whitening transform ``V S^-1 V^T`` of ``matrix``'s rows (its SVD U S V^T)."""
    _, singular, vt = np.linalg.svd(matrix, full_matrices=False)
    return vt.T @ np.diag(1.0 / singular) @ vt


def reweighted_maps(source: np.ndarray, target: np.ndarray, rows: np.ndarray,
                    columns: np.ndarray, power: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Artetxe et al. (2018a)'s final mapping from a dictionary (``source[rows]`` paired with
    ``target[columns]``): whiten each side, map both orthogonally onto a shared space,
    re-weight its dimensions by the cross-covariance's singular values to ``power``, and
    de-whiten each side in its own space. Returns the two maps (applied as ``x @ W_x``,
    ``z @ W_z``); both sides move, unlike Procrustes."""
    white_x, white_z = _whitening(source[rows]), _whitening(target[columns])
    u, singular, vt = np.linalg.svd((source[rows] @ white_x).T @ (target[columns] @ white_z))
    weight = np.diag(singular ** power)
    map_x = white_x @ u @ weight @ u.T @ np.linalg.inv(white_x) @ u
    map_z = white_z @ vt.T @ weight @ vt @ np.linalg.inv(white_z) @ vt.T
    return map_x.astype(np.float32), map_z.astype(np.float32)


def robust_self_learning(source: np.ndarray, target: np.ndarray,
                         seed: Sequence[tuple[int, int]], cutoff: int = 20_000, k: int = 10,
                         keep: float = 0.1, patience: int = 50, tolerance: float = 1e-6,
                         max_iterations: int = 2_000, random_seed: int = 0
                         ) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """Artetxe et al. (2018b)'s robust self-learning, from a seed dictionary of (source row,
    target row) pairs: each iteration fits the orthogonal map on the dictionary, then induces
    a new one among the ``cutoff`` most frequent words of each side (rows in frequency order),
    in both directions (their union), by CSLS over similarities each kept with probability
    ``keep``; ``keep`` doubles whenever the objective (the mean best cosine, both directions)
    has not improved by ``tolerance`` for ``patience`` iterations, and the loop ends when it
    stalls at 1. The last dictionary then fits :func:`reweighted_maps`. Rows should be
    normalised (:func:`centred_unit_rows`). Returns the source map, the target map and the
    objective per iteration."""
    check_at_least(cutoff, 1, "cutoff")
    check_at_least(patience, 1, "patience")
    if not 0 < keep <= 1:
        raise LmlabError(f"keep must be in (0, 1], got {keep}", "pass e.g. keep=0.1 (the paper's)")
    if not seed:
        raise LmlabError("the seed dictionary is empty", "give at least one (source, target) pair")
    rng = np.random.default_rng(random_seed)
    x, z = source[:cutoff], target[:cutoff]
    targets = unit_rows(z)  # (T, d), fixed across iterations
    rows, columns = np.array([s for s, _ in seed]), np.array([t for _, t in seed])
    history: list[float] = []
    best_objective, last_improvement = -np.inf, 0
    bar = progress(desc="robust self-learning", total=max_iterations, unit="it")
    for iteration in range(max_iterations):
        mapped = x @ procrustes(source[rows], target[columns])
        mapped = unit_rows(mapped)
        # the transpose as a second product, not a contiguous copy of the first: the same bits,
        # and the copy was slower (0.63 s against 0.43 s at 10,000 x 10,000, Zen 4, 2 threads)
        objective, forward, backward = _induce(mapped @ targets.T, targets @ mapped.T, keep, k,
                                               rng)
        rows = np.concatenate([np.arange(len(x)), backward])
        columns = np.concatenate([forward, np.arange(len(z))])
        history.append(objective)
        bar.update()
        bar.set_postfix(keep=keep, objective=f"{objective:.4f}")
        if history[-1] - best_objective >= tolerance:
            best_objective, last_improvement = history[-1], iteration
        elif iteration - last_improvement >= patience:
            if keep >= 1.0:
                break
            keep, last_improvement = min(1.0, 2 * keep), iteration
    bar.close()
    source_map, target_map = reweighted_maps(source, target, rows, columns)
    return source_map, target_map, history


def mean_top_k_cosine(queries: np.ndarray, keys: np.ndarray, k: int, batch: int = 1024
                      ) -> np.ndarray:
    """For each unit row of ``queries``, the mean cosine of its ``k`` nearest unit ``keys``."""
    k = min(k, len(keys))
    out = np.empty(len(queries), dtype=np.float32)
    for start in range(0, len(queries), batch):
        out[start:start + batch] = _mean_top_k_rows(queries[start:start + batch] @ keys.T, k)
    return out


def retrieve(mapped: np.ndarray, target: np.ndarray, retrieval: str = "csls", k: int = 10,
             source_for_hubness: np.ndarray | None = None, best: int = 1) -> np.ndarray:
    """The row of ``target`` retrieved for each row of ``mapped`` (both unit-normalised
    inside), or with ``best`` > 1 the ``best`` rows, best first (Q, best). CSLS's r_S(y) is
    computed against ``source_for_hubness`` (the whole mapped source vocabulary; ``mapped``
    itself when None)."""
    check_choice(retrieval, RETRIEVALS, "retrieval", "retrieval")
    mapped, target = unit_rows(mapped), unit_rows(target)
    scores = mapped @ target.T  # (Q, T) cosines
    if retrieval == "csls":
        hub_source = mapped if source_for_hubness is None else unit_rows(source_for_hubness)
        r_target = mean_top_k_cosine(mapped, target, k)       # (Q,) r_T(Wx)
        r_source = mean_top_k_cosine(target, hub_source, k)   # (T,) r_S(y)
        scores = 2 * scores - r_target[:, None] - r_source[None, :]
    if best == 1:
        return scores.argmax(axis=1)
    top = np.argpartition(-scores, best - 1, axis=1)[:, :best]  # (Q, best), unordered
    order = np.take_along_axis(scores, top, axis=1).argsort(axis=1)[:, ::-1]
    return np.take_along_axis(top, order, axis=1)


def identical_word_pairs(source: WordVectors, target: WordVectors, top: int = 5000
                         ) -> list[tuple[str, str]]:
    """A seed dictionary for two spaces of one language: the words both have, in the source's
    frequency order, at most ``top`` of them (each word paired with itself)."""
    pairs = [(w, w) for w in source.words if w in target.index][:top]
    if not pairs:
        raise LmlabError("the two vocabularies share no word",
                         "give a seed dictionary file (one 'source target' pair per line)")
    return pairs


def read_dictionary(path: str | Path) -> list[tuple[str, str]]:
    """A bilingual dictionary file (MUSE's format): one ``source target`` pair per line."""
    pairs = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) == 2:
            pairs.append((parts[0], parts[1]))
    if not pairs:
        raise LmlabError(f"{path} holds no 'source target' pairs",
                         "write one pair per line, separated by a space or tab")
    return pairs


@dataclass
class AlignmentReport:
    """Precision@1 of held-out translations per method (``unaligned``: the spaces compared
    directly, W = I; ``nn`` and ``csls``: after Procrustes), and what the map was fitted on."""

    train_pairs: int
    test_words: int
    skipped_pairs: int
    precision: dict[str, float] = field(default_factory=dict)
    mapping: np.ndarray | None = None


def align_spaces(source: WordVectors, target: WordVectors, pairs: Sequence[tuple[str, str]],
                 test_fraction: float = 0.2, seed: int = 0, k: int = 10,
                 target_vocab: int | None = 50_000) -> AlignmentReport:
    """Fit Procrustes on a random ``1 - test_fraction`` of the source words of ``pairs`` and
    report precision@1 of translating the rest into the first ``target_vocab`` target words
    (any gold translation counts). CSLS's cost is quadratic in ``target_vocab``."""
    if source.dim != target.dim:
        raise LmlabError(f"the spaces have {source.dim} and {target.dim} dimensions",
                         "an orthogonal map needs equal dimensions: use vectors of one size")
    if not 0 < test_fraction < 1:
        raise LmlabError(f"test_fraction must be between 0 and 1, not {test_fraction}",
                         "hold out a fraction such as 0.2")
    usable = [(s, t) for s, t in pairs if s in source.index and t in target.index]
    if not usable:
        raise LmlabError(f"none of the {len(pairs)} dictionary pairs has vectors in both spaces",
                         "check the dictionary's direction (source target) and the words' case")
    gold: dict[str, set[str]] = {}
    for s, t in usable:
        gold.setdefault(s, set()).add(t)
    words = sorted(gold)
    random.Random(seed).shuffle(words)
    held = max(1, int(round(len(words) * test_fraction)))
    test_words, train_words = words[:held], words[held:]
    if len(train_words) < 2:
        raise LmlabError(f"only {len(train_words)} dictionary words left to fit the map",
                         "give a larger seed dictionary or a smaller test_fraction")
    train = [(s, t) for s, t in usable if s in set(train_words)]
    x = np.stack([source.vector(s) for s, _ in train])
    y = np.stack([target.vector(t) for _, t in train])
    mapping = procrustes(unit_rows(x), unit_rows(y))

    candidates = target.words[:target_vocab]
    candidate_rows = np.asarray(target.matrix[:target_vocab])
    queries = np.stack([source.vector(w) for w in test_words])  # (Q, D)
    hub = np.asarray(source.matrix[:target_vocab]) @ mapping
    report = AlignmentReport(len(train), len(test_words), len(pairs) - len(usable),
                             mapping=mapping)
    found = {"unaligned": retrieve(queries, candidate_rows, "nn"),
             "nn": retrieve(queries @ mapping, candidate_rows, "nn"),
             "csls": retrieve(queries @ mapping, candidate_rows, "csls", k, hub)}
    for name, rows in found.items():
        hits = sum(candidates[r] in gold[w] for w, r in zip(test_words, rows))
        report.precision[name] = hits / len(test_words)
    return report


def align_files(source: str, target: str, dictionary: str | None = None, top: int = 5000,
                test_fraction: float = 0.2, target_vocab: int = 50_000,
                limit: int | None = None, seed: int = 0, save_mapping: str | None = None,
                overwrite: bool = False) -> AlignmentReport:
    """``lmlab vectors align``: map the vectors of ``source`` onto ``target`` (files or
    ``glove-6b-50d``) from ``dictionary`` (default: the ``top`` shared words), print the
    held-out precision@1 of each retrieval and save the map (.npy) to ``save_mapping``."""
    from lmlab.utils.io import atomic_path
    from lmlab.vectors.keyed import load_vectors

    check_at_least(top, 1, "--top")
    check_at_least(target_vocab, 1, "--target-vocab")
    check_at_least(limit, 1, "--limit")
    if dictionary:
        check_file(dictionary, "--dictionary", "give a file of 'source target' lines")
    if save_mapping:
        check_output_file(save_mapping, overwrite, "--save-mapping")
    source_vectors = load_vectors(source, limit=limit)
    target_vectors = load_vectors(target, limit=limit)
    pairs = (read_dictionary(dictionary) if dictionary
             else identical_word_pairs(source_vectors, target_vectors, top))
    report = align_spaces(source_vectors, target_vectors, pairs, test_fraction, seed,
                          target_vocab=target_vocab)
    print(f"fitted on {report.train_pairs} pairs, tested on {report.test_words} held-out words "
          f"({report.skipped_pairs} dictionary pairs without vectors)")
    for name, label in (("unaligned", "unaligned (W = I)"), ("nn", "Procrustes + nearest"),
                        ("csls", "Procrustes + CSLS")):
        print(f"    {label:<24} precision@1 {100 * report.precision[name]:.1f}%")
    if save_mapping:
        with atomic_path(save_mapping) as tmp, open(tmp, "wb") as handle:
            np.save(handle, report.mapping)
        print(f"wrote {save_mapping}")
    return report


METHODS = ("identity", "least-squares", "procrustes", "self-learning", "robust self-learning")


def compare_alignments(source: WordVectors, target: WordVectors,
                       train_pairs: Sequence[tuple[str, str]],
                       test_pairs: Sequence[tuple[str, str]],
                       seed_pairs: Sequence[tuple[str, str]], vocabulary: int = 20_000,
                       k: int = 10, random_seed: int = 0, patience: int = 50
                       ) -> dict[str, dict[str, float]]:
    """Precision@1 and @5 of translating the source words of ``test_pairs`` (any gold target
    counts) among the first ``vocabulary`` target words, for each of :data:`METHODS` and both
    retrievals: ``{"procrustes": {"nn@1": ..., "nn@5": ..., "csls@1": ..., "csls@5": ...}}``.
    The supervised maps fit ``train_pairs``; both self-learnings start from ``seed_pairs``
    only (the robust one's dropout draws from ``random_seed``; ``patience``: its iterations
    without improvement before the keep probability doubles);
    ``identity`` compares the spaces directly (the floor). Both spaces are normalised with
    :func:`centred_unit_rows` over their first ``vocabulary`` words."""
    check_at_least(vocabulary, 2, "vocabulary")
    if source.dim != target.dim:
        raise LmlabError(f"the spaces have {source.dim} and {target.dim} dimensions",
                         "a linear map between them needs equal dimensions")
    x = centred_unit_rows(source.matrix[:vocabulary])
    z = centred_unit_rows(target.matrix[:vocabulary])
    source_row = {w: i for i, w in enumerate(source.words[:vocabulary])}
    target_row = {w: i for i, w in enumerate(target.words[:vocabulary])}

    def rows(pairs: Sequence[tuple[str, str]], what: str) -> list[tuple[int, int]]:
        found = [(source_row[s], target_row[t]) for s, t in pairs
                 if s in source_row and t in target_row]
        if not found:
            raise LmlabError(f"none of the {len(pairs)} {what} pairs has both words among the "
                             f"first {vocabulary} of each space",
                             "check the pairs' direction and case, or raise the vocabulary")
        return found

    train, test, seed = rows(train_pairs, "training"), rows(test_pairs, "test"), \
        rows(seed_pairs, "seed")
    gold: dict[int, set[int]] = {}
    for s, t in test:
        gold.setdefault(s, set()).add(t)
    queries = np.array(sorted(gold))
    pairs_x, pairs_z = x[[s for s, _ in train]], z[[t for _, t in train]]
    identity = np.eye(x.shape[1], dtype=np.float32)
    maps = {"identity": (identity, identity),  # method -> (source map, target map)
            "least-squares": (least_squares(pairs_x, pairs_z), identity),
            "procrustes": (procrustes(pairs_x, pairs_z), identity),
            "self-learning": (self_learning(x, z, seed, "nn", k=k)[0], identity),
            "robust self-learning": robust_self_learning(
                x, z, seed, k=k, patience=patience, random_seed=random_seed)[:2]}
    table: dict[str, dict[str, float]] = {}
    for method, (source_map, target_map) in maps.items():
        mapped, space = x @ source_map, z @ target_map
        table[method] = {}
        for retrieval in RETRIEVALS:
            top = retrieve(mapped[queries], space, retrieval, k, mapped, best=5)  # (Q, 5)
            for at in (1, 5):
                hits = sum(bool(gold[q] & set(found[:at].tolist())) for q, found in
                           zip(queries.tolist(), top))
                table[method][f"{retrieval}@{at}"] = hits / len(queries)
    return table
