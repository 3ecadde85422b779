"""The one way lmlab takes a subset of a split: stable, label-stratified, never a prefix.

Task files are often sorted by id, hence by label (the first 100 test examples of
``fortunes-topic`` cover 2 of its 40 topics), so "the first N examples" measures a slice of the
labels. :func:`sample_examples` is used wherever a count caps a split: fine-tuning's
``max_train_examples``, few-shot evaluation's ``max_examples``, the demo's evaluation subsets.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any


def sample_examples(examples: Sequence[Any], count: int | None) -> list:
    """``count`` examples, stratified by label, in the order they had in ``examples``.

    Each label's examples are ranked by a stable hash of their ids (SHA-256, so the subset is
    the same on every machine, seed and run); example ``i`` of a label with ``n`` examples gets
    the key ``i / n`` and the ``count`` smallest keys are kept (ties by hash). So every label's
    first example comes before any label's second one: a sample covers ``min(count, labels)``
    labels, and beyond that each label gets a share proportional to its frequency (systematic
    sampling), so the majority-class rate of the sample stays close to the split's.
    Examples whose label is not a string (regression scores, tag lists, QA) form one group,
    which makes the sample a plain hash-ordered draw.
    """
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
