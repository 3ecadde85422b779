"""Built-in downstream tasks made from real labelled data in offline Debian packages
(``wordnet-supersense``, ``wordnet-wic``, ``fortunes-topic``), at a ``full`` and a ``cpu`` size,
split by SHA-256 hashes of stable keys and cached as gzip JSON (docs/tasks.md describes each).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from lmlab.tasks.types import SPLITS, Example, Task
from lmlab.text.sources import fortunes, wordnet
from lmlab.utils.checks import check_choice
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import (
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    read_json,
    stable_hash,
)
from lmlab.utils.paths import cache_dir

BUILD_VERSION = 1
SIZES = ("cpu", "full")
CPU_SIZES = {"train": 4000, "dev": 1000, "test": 1000}
FRACTIONS = (0.8, 0.1, 0.1)  # train / dev / test
FORTUNE_MIN_ENTRIES = 20  # categories with fewer entries are too small to evaluate
WIC_MAX_POSITIVES_PER_LEMMA = 6


def hash_unit(key: str) -> float:
    """A stable number in [0, 1) from a string (SHA-256; the same on every machine and run)."""
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def hash_split(key: str, fractions: Sequence[float] = FRACTIONS) -> str:
    """``train`` / ``dev`` / ``test`` for ``key``, in ``fractions`` by its hash: the same split
    on every machine and run, and one split for everything that shares the key."""
    unit = hash_unit(key)
    if unit < fractions[0]:
        return "train"
    return "dev" if unit < fractions[0] + fractions[1] else "test"


def hash_splits(items: Iterable[Any], key: Callable[[Any], str],
                fractions: Sequence[float] = FRACTIONS) -> dict[str, list]:
    """``items`` by :func:`hash_split` of ``key(item)``."""
    if abs(sum(fractions) - 1.0) > 1e-9 or min(fractions) < 0:
        raise LmlabError(f"split fractions {tuple(fractions)} must be non-negative and sum to 1",
                         "use e.g. (0.8, 0.1, 0.1)")
    splits: dict[str, list] = {"train": [], "dev": [], "test": []}
    for item in items:
        splits[hash_split(key(item), fractions)].append(item)
    return splits


def split_of(key: str) -> str:
    """The built-in tasks' split of a key (80/10/10 by hash)."""
    return hash_split("split:" + key)


# ----------------------------------------------------------------------------- builders


def build_wordnet_supersense() -> Task:
    """Every synset with a definition: text = definition, label = lexicographer file name."""
    folder = wordnet.wordnet_dir()
    names = wordnet.lexnames(folder)
    examples = [Example(id=synset.id, text=synset.definition, label=names[synset.lex_filenum],
                        extra={"lemmas": synset.lemmas})
                for synset in wordnet.read_synsets(folder) if synset.definition]
    splits = hash_splits(examples, lambda example: "split:" + example.id)
    return Task(name="wordnet-supersense", type="classification", labels=list(names),
                metrics=["accuracy", "macro_f1"], splits=splits,
                description="WordNet definition -> supersense (lexicographer file, 45 classes)")


def wic_occurrences(synsets, exceptions) -> dict[tuple[str, str], dict[str, list[dict]]]:
    """``{(lemma, pos): {synset id: [{sentence, span}]}}``: each example sentence is assigned to
    one lemma of its synset, the matching lemma that occurs in the most synsets' examples."""
    candidates = []  # (synset, sentence, {lemma: span})
    synsets_of: dict[tuple[str, str], set[str]] = defaultdict(set)
    for synset, sentence, found in wordnet.lemma_occurrences(synsets, exceptions):
        by_lemma = {synset.lemmas[i].lower(): span for i, span in found.items()}
        candidates.append((synset, sentence, by_lemma))
        for lemma in by_lemma:
            synsets_of[(lemma, synset.pos)].add(synset.id)
    groups: dict[tuple[str, str], dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for synset, sentence, by_lemma in candidates:
        lemma = max(by_lemma, key=lambda lem: len(synsets_of[(lem, synset.pos)]))
        groups[(lemma, synset.pos)][synset.id].append(
            {"sentence": sentence, "span": list(by_lemma[lemma])})
    return groups


def build_wordnet_wic() -> Task:
    """Word-in-context pairs from WordNet's example sentences, balanced, split by lemma: same
    synset (at most :data:`WIC_MAX_POSITIVES_PER_LEMMA` per lemma) or different synsets (taken
    round-robin over lemmas until as many as the positives)."""
    folder = wordnet.wordnet_dir()
    groups = wic_occurrences(wordnet.read_synsets(folder), wordnet.read_exceptions(folder))
    positives: list[tuple] = []
    negatives_by_group: list[list[tuple]] = []
    for (lemma, pos) in sorted(groups):
        by_synset = groups[(lemma, pos)]
        if len(by_synset) < 2:
            continue
        items = [(sid, i, occ) for sid in sorted(by_synset) for i, occ in enumerate(by_synset[sid])]
        pos_pairs, neg_pairs = [], []
        for a in range(len(items)):
            for b in range(a + 1, len(items)):
                pair = (lemma, pos, items[a], items[b])
                (pos_pairs if items[a][0] == items[b][0] else neg_pairs).append(pair)

        def order(pair: tuple) -> float:
            return hash_unit(f"wic:{pair[0]}|{pair[1]}|{pair[2][:2]}|{pair[3][:2]}")

        pos_pairs.sort(key=order)
        neg_pairs.sort(key=order)
        positives.extend(pos_pairs[:WIC_MAX_POSITIVES_PER_LEMMA])
        negatives_by_group.append(neg_pairs)
    negatives: list[tuple] = []
    depth = 0
    while len(negatives) < len(positives) and any(len(g) > depth for g in negatives_by_group):
        for group in negatives_by_group:
            if depth < len(group) and len(negatives) < len(positives):
                negatives.append(group[depth])
        depth += 1
    examples = []
    for label, pairs in (("same", positives), ("different", negatives)):
        for lemma, pos, (sid1, i1, occ1), (sid2, i2, occ2) in pairs:
            first, second = occ1, occ2
            if hash_unit(f"swap:{sid1}{i1}{sid2}{i2}") < 0.5:  # no order cue for the label
                (sid1, i1, first), (sid2, i2, second) = (sid2, i2, occ2), (sid1, i1, occ1)
            examples.append(Example(
                id=f"{lemma}|{pos}|{sid1}.{i1}|{sid2}.{i2}", text=first["sentence"],
                text_pair=second["sentence"], label=label,
                extra={"word": lemma, "pos": pos, "span1": first["span"],
                       "span2": second["span"], "synset1": sid1, "synset2": sid2}))
    splits = hash_splits(sorted(examples, key=lambda e: e.id),
                         lambda example: "split:lemma:" + example.extra["word"])
    return Task(name="wordnet-wic", type="pair-classification", labels=["different", "same"],
                metrics=["accuracy", "f1"], splits=splits, positive_label="same",
                description="two WordNet example sentences with one lemma: same sense? "
                            "(word-in-context, split by lemma)")


def build_fortunes_topic() -> Task:
    """Fortune entries -> category; entries filed under two categories are dropped."""
    by_category = fortunes.read_all_fortunes()
    where: dict[str, set[str]] = defaultdict(set)
    text_of: dict[str, str] = {}
    for category, entries in by_category.items():
        for entry in entries:
            key = " ".join(entry.split())
            where[key].add(category)
            text_of.setdefault(key, entry)
    kept = {c for c, entries in by_category.items() if len(entries) >= FORTUNE_MIN_ENTRIES}
    examples = []
    for key in sorted(where):
        categories = where[key]
        if len(categories) != 1:
            continue
        (category,) = categories
        if category not in kept:
            continue
        digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
        examples.append(Example(id=f"{category}:{digest}", text=text_of[key], label=category))
    # split by the entry's text, whitespace collapsed (its key); each split in id order
    splits = hash_splits(sorted(examples, key=lambda e: e.id),
                         lambda example: "split:fortune:" + " ".join(example.text.split()))
    return Task(name="fortunes-topic", type="classification", labels=sorted(kept),
                metrics=["accuracy", "macro_f1"], splits=splits,
                description=f"fortune-cookie entry -> category ({len(kept)} classes)")


def _wordnet_sources() -> list[Path]:
    """The WordNet files the built tasks depend on (their stamps key the cache)."""
    folder = wordnet.wordnet_dir()
    return sorted(p for p in folder.iterdir() if p.name.startswith(("data.", "lexnames"))
                  or p.suffix == ".exc")


BUILTIN_TASKS: dict[str, tuple[Callable[[], Task], Callable[[], list[Path]]]] = {
    "wordnet-supersense": (build_wordnet_supersense, _wordnet_sources),
    "wordnet-wic": (build_wordnet_wic, _wordnet_sources),
    "fortunes-topic": (build_fortunes_topic, fortunes.category_files),
}


# ----------------------------------------------------------------------------- cache + sizes


def _cache_file(name: str, cache: str | os.PathLike | None) -> Path:
    sources = [(str(p), p.stat().st_size, int(p.stat().st_mtime)) for p in BUILTIN_TASKS[name][1]()]
    key = stable_hash({"version": BUILD_VERSION, "sources": sources})
    root = Path(cache) if cache is not None else cache_dir()
    return root / "tasks" / f"{name}-{key}.json.gz"


_LOADED: dict[Path, Task] = {}  # cache file -> task, so one process parses each file once


def load_full_task(name: str, cache: str | os.PathLike | None = None,
                   rebuild: bool = False) -> Task:
    """The full-size built-in task, from the cache (built and cached if not there); shared
    within the process: treat it as read-only."""
    check_choice(name, BUILTIN_TASKS, "task", "built-in task")
    path = _cache_file(name, cache)
    if not rebuild and path in _LOADED:
        return _LOADED[path]
    task = None
    if path.is_file() and not rebuild:
        try:
            task = Task.from_dict(json.loads(gzip.decompress(path.read_bytes())))
        except (OSError, ValueError, KeyError, TypeError):
            task = None  # a damaged cache file is rebuilt below
    if task is None:
        task = BUILTIN_TASKS[name][0]()
        # json.dumps runs the C encoder; json.dump into a stream would use the slow Python one
        data = json.dumps(task.to_dict(), ensure_ascii=False).encode("utf-8")
        atomic_write_bytes(path, gzip.compress(data, compresslevel=1))
        atomic_write_json(_sizes_file(path), _row(task))
    _LOADED[path] = task
    return task


def _sizes_file(cache_file: Path) -> Path:
    return cache_file.with_name(cache_file.name.replace(".json.gz", ".sizes.json"))


def _row(full: Task) -> dict[str, Any]:
    """The ``list_tasks`` row of a full task (sizes of both the full and the cpu splits)."""
    sizes = {split: len(full.splits.get(split, [])) for split in SPLITS}
    return {"name": full.name, "type": full.type, "classes": len(full.labels),
            **{f"cpu_{split}": min(n, CPU_SIZES[split]) for split, n in sizes.items()},
            **{f"full_{split}": n for split, n in sizes.items()},
            "metrics": ",".join(full.metrics), "description": full.description}


def cpu_subset(task: Task, sizes: dict[str, int] | None = None) -> Task:
    """The CPU-sized task: the first ``sizes[split]`` examples of each split in hash order."""
    sizes = sizes or CPU_SIZES
    splits = {}
    for split, examples in task.splits.items():
        ordered = sorted(examples, key=lambda e: hash_unit(f"cpu:{e.id}"))
        splits[split] = sorted(ordered[:sizes.get(split, len(ordered))], key=lambda e: e.id)
    return Task(name=task.name, type=task.type, labels=list(task.labels),
                metrics=list(task.metrics), splits=splits, positive_label=task.positive_label,
                description=task.description + " [cpu size]")


def load_builtin_task(name: str, size: str = "cpu", cache: str | os.PathLike | None = None,
                      rebuild: bool = False) -> Task:
    """A built-in task at ``size`` ``"cpu"`` (4k/1k/1k) or ``"full"``."""
    check_choice(size, SIZES, "size", "task size")
    full = load_full_task(name, cache, rebuild)
    return full if size == "full" else cpu_subset(full)


def list_tasks(cache: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """One row per built-in task: name, type, classes, cpu and full split sizes, metrics (read
    beside the cache; a task not built yet is built first, a few seconds)."""
    rows = []
    for name in BUILTIN_TASKS:
        sizes = _sizes_file(_cache_file(name, cache))
        if not sizes.is_file():
            load_full_task(name, cache, rebuild=True)
        rows.append(read_json(sizes))
    return rows


def eval_texts(task_names: Iterable[str], splits: Iterable[str] = ("dev", "test"),
               size: str = "full", cache: str | os.PathLike | None = None) -> list[str]:
    """The distinct texts of ``splits`` of each task, whitespace collapsed: what must not leak
    into a pretraining corpus (full size: its dev/test splits contain the cpu ones)."""
    seen: set[str] = set()
    lines: list[str] = []
    splits = list(splits)
    for name in task_names:
        task = load_builtin_task(name, size, cache)
        for split in splits:
            for example in task.split(split):  # an unknown split is an error naming the splits
                for text in example.eval_texts():
                    line = " ".join(text.split())
                    if line and line not in seen:
                        seen.add(line)
                        lines.append(line)
    return lines


def export_eval_texts(task_names: Iterable[str], path: str | os.PathLike,
                      splits: Iterable[str] = ("dev", "test"), size: str = "full",
                      cache: str | os.PathLike | None = None) -> int:
    """Write :func:`eval_texts` to ``path``, one per line (``lmlab data build --exclude``);
    returns the number of lines."""
    lines = eval_texts(task_names, splits, size, cache)
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return len(lines)
