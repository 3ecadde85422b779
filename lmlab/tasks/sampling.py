"""The one way lmlab takes a subset of a split: stable, label-stratified, never a prefix (task
files are often sorted by label, so "the first N examples" measures a slice of the labels).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any


def sample_examples(examples: Sequence[Any], count: int | None) -> list:
    """``count`` examples, stratified by label (systematic sampling in the order of a hash of
    their ids; docs/tasks.md), in the order they had in ``examples``. Examples whose label is not
    a string (scores, tag lists, QA) form one group."""
    from lmlab.tasks.builtin import hash_unit

    if not count or count >= len(examples):
        return list(examples)
    groups: dict[Any, list[int]] = defaultdict(list)
    for index, example in enumerate(examples):
        label = getattr(example, "label", None)
        groups[label if isinstance(label, str) else None].append(index)
    unit = [hash_unit(f"subset:{example.id}") for example in examples]
    keys: dict[int, tuple[float, float]] = {}
    for members in groups.values():
        members.sort(key=lambda index: unit[index])
        for rank, index in enumerate(members):
            keys[index] = (rank / len(members), unit[index])
    chosen = sorted(keys, key=keys.__getitem__)[:count]
    return [examples[index] for index in sorted(chosen)]
