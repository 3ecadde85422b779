"""Sentence pairs for bi-encoder training, built offline from WordNet 3.0 (an example sentence and
its synset's gloss; negatives from a synset sharing a lemma), split by synset id, WiC's
evaluation sentences dropped from train; read and written as JSON-lines pair folders.
docs/sentence-encoders.md ("Pairs from WordNet") tells the story.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lmlab.utils.errors import LmlabError
from lmlab.utils.io import iter_jsonl

PAIR_SPLITS = ("train", "dev", "test")
REQUIRED_FIELDS = ("sentence1", "sentence2", "label")


@dataclass(frozen=True)
class SentencePair:
    """Two texts, a label (1 = same meaning, 0 = not), the group (synset) of the second, and
    optionally a similarity ``score`` in [-1, 1] (the regression target) and a ``negative``
    (a third text unlike the first: the triplet objective's)."""

    sentence1: str
    sentence2: str
    label: int
    group: str = ""
    score: float | None = None
    negative: str = ""


def build_wordnet_pairs(exclude_wic: bool = True) -> tuple[dict[str, list[SentencePair]],
                                                          dict[str, Any]]:
    """(pairs by split, info) from the installed WordNet (see the module docstring)."""
    from lmlab.tasks.builtin import hash_unit, split_of
    from lmlab.text.sources import wordnet

    synsets = [s for s in wordnet.read_synsets() if s.definition and s.examples]
    by_split: dict[str, list] = defaultdict(list)
    for synset in synsets:
        by_split[split_of(synset.id)].append(synset)
    held_out = set()
    if exclude_wic:
        from lmlab.tasks.builtin import load_full_task

        wic = load_full_task("wordnet-wic")
        held_out = {text for split in ("dev", "test") for e in wic.split(split)
                    for text in (e.text, e.text_pair)}
    pairs: dict[str, list[SentencePair]] = {}
    dropped = 0
    for split in PAIR_SPLITS:
        members = sorted(by_split[split], key=lambda s: s.id)
        with_lemma: dict[tuple[str, str], list] = defaultdict(list)
        for synset in members:
            for lemma in synset.lemmas:
                with_lemma[(lemma.lower(), synset.pos)].append(synset)
        rows: list[SentencePair] = []
        for synset in members:
            others = sorted({s.id: s for lemma in synset.lemmas
                             for s in with_lemma[(lemma.lower(), synset.pos)]
                             if s.id != synset.id}.values(), key=lambda s: s.id)
            for index, example in enumerate(synset.examples):
                if split == "train" and example in held_out:
                    dropped += 1
                    continue
                key = f"pair:{synset.id}:{index}"
                if others:
                    negative = others[int(hash_unit(key) * len(others))]
                else:
                    negative = members[int(hash_unit(key) * len(members))]
                    if negative.id == synset.id:
                        negative = members[(members.index(negative) + 1) % len(members)]
                rows.append(SentencePair(example, synset.definition, 1, synset.id))
                rows.append(SentencePair(example, negative.definition, 0, negative.id))
        pairs[split] = rows
    info = {"source": "WordNet 3.0 (glosses and their example sentences)",
            "split_by": "synset id (lmlab.tasks.builtin.split_of)",
            "synsets": {s: len(by_split[s]) for s in PAIR_SPLITS},
            "pairs": {s: len(pairs[s]) for s in PAIR_SPLITS},
            "train_examples_dropped_as_wic_eval_text": dropped}
    return pairs, info


def write_pairs(folder: str | Path, pairs: dict[str, list[SentencePair]], info: dict[str, Any],
                overwrite: bool = False) -> Path:
    """Write a pair folder (refused over one that holds files, unless ``overwrite``)."""
    from lmlab.utils.checks import check_output_folder
    from lmlab.utils.io import atomic_write_json, atomic_write_text

    folder = Path(folder)
    check_output_folder(folder, overwrite, "pair folder")
    folder.mkdir(parents=True, exist_ok=True)
    for split, rows in pairs.items():
        atomic_write_text(folder / f"{split}.jsonl", "".join(
            json.dumps({k: v for k, v in asdict(row).items() if v not in (None, "")},
                       ensure_ascii=False) + "\n" for row in rows))
    atomic_write_json(folder / "info.json", info)
    return folder


def read_pairs(path: str | Path) -> list[SentencePair]:
    """Pairs of one JSON-lines file, every line checked (refusals name the line)."""
    path = Path(path)
    if not path.is_file():
        raise LmlabError(f"pair file {path} does not exist",
                         "write one with `lmlab sentence pairs --out DIR` (DIR/train.jsonl)")
    rows: list[SentencePair] = []
    for number, record in iter_jsonl(path):
        missing = [f for f in REQUIRED_FIELDS if record.get(f) in (None, "")]
        if missing:
            raise LmlabError(f"{path}:{number} has no {', '.join(missing)}",
                             "give every line sentence1, sentence2 and label (1 = same "
                             "meaning, 0 = not)")
        label = record["label"]
        if isinstance(label, bool) or not isinstance(label, int) or label < 0:
            raise LmlabError(f"{path}:{number}: label {label!r} is not a class number",
                             "use 0, 1, ... (1 = same meaning, 0 = not)")
        score = record.get("score")
        if score is not None and (isinstance(score, bool) or not isinstance(score, int | float)
                                  or not -1 <= score <= 1):
            raise LmlabError(f"{path}:{number}: score {score!r} is not a number in [-1, 1]",
                             "give the similarity as a cosine target (STS's 0-5 divided by 5)")
        rows.append(SentencePair(str(record["sentence1"]), str(record["sentence2"]), label,
                                 str(record.get("group") or record["sentence2"]),
                                 None if score is None else float(score),
                                 str(record.get("negative") or "")))
    if not rows:
        raise LmlabError(f"pair file {path} is empty", "give at least two pairs")
    return rows


def pair_file(data: str | Path, split: str) -> Path:
    """The file of ``split`` in a pair folder, or ``data`` itself when it is a file."""
    data = Path(data)
    return data / f"{split}.jsonl" if data.is_dir() else data
