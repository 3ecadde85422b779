"""Data-mixture weights over corpus sources (``--mix kjv=0.3,wordnet=0.7``): each training
example is drawn from a source with its weight, as GPT-3 (Table 2.2) and T5 sample their
mixtures. A source's examples come in a shuffled order of its own, reshuffled each time it runs
out, so a small source with a large weight is seen for more epochs. Every draw depends only on
the seed and the draw's number: a resumed stream continues exactly (docs/training.md,
"Data-mixture weights")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from lmlab.utils.errors import LmlabError

_BLOCK = 4096  # source choices drawn at once


def parse_mix(spec: str | Mapping[str, float]) -> dict[str, float]:
    """``"kjv=0.3,wordnet=0.7"`` (or a mapping) as ``{source: weight}``, sorted by name; the
    weights must be positive and sum to 1 (a source left out is not sampled)."""
    if isinstance(spec, Mapping):
        pairs = [(str(name), value) for name, value in spec.items()]
    else:
        pairs = [tuple(part.split("=", 1)) if "=" in part else (part, "")
                 for part in str(spec).split(",") if part.strip()]
    weights: dict[str, float] = {}
    for name, value in pairs:
        name = name.strip()
        try:
            weight = float(value)
        except (TypeError, ValueError):
            raise LmlabError(f"cannot read the mixture weight {name}={value!r} in {spec!r}",
                             "write source=weight pairs, e.g. --mix kjv=0.3,wordnet=0.7"
                             ) from None
        if not name or name in weights:
            raise LmlabError(f"the mixture {spec!r} names a source twice or not at all",
                             "name each source once: --mix kjv=0.3,wordnet=0.7")
        if not 0 < weight <= 1:
            raise LmlabError(f"mixture weight {name}={value} is not in (0, 1]",
                             "give each source a positive share, e.g. kjv=0.3")
        weights[name] = weight
    if not weights:
        raise LmlabError("the mixture names no source", "write e.g. --mix kjv=0.3,wordnet=0.7")
    total = sum(weights.values())
    if abs(total - 1.0) > 1e-6:
        raise LmlabError(f"the mixture weights in {spec!r} sum to {total:g}, not 1",
                         "make the shares add up to 1, e.g. kjv=0.3,wordnet=0.7")
    return dict(sorted(weights.items()))


def check_mix(weights: Mapping[str, float], available: Sequence[str] | None, where: str) -> None:
    """Refuse sources that ``where`` (a shard folder's train split) does not hold, or a split
    that does not record its documents' sources (shards of an older lmlab)."""
    if available is None:
        raise LmlabError(f"{where} does not record its documents' sources (written by an older "
                         "lmlab)", "tokenize the corpus again: lmlab data tokenize --overwrite")
    unknown = sorted(set(weights) - set(available))
    if unknown:
        raise LmlabError(f"--mix names sources {where} does not hold: {', '.join(unknown)}",
                         f"its sources are: {', '.join(available)}")


class SourceMixture:
    """Which unit (packed window or document) each drawn example comes from.

    ``unit_sources`` (U,) is each unit's source code into ``names``; ``weights`` the mixture.
    Draw ``n``'s source is a weighted choice seeded by (seed, n // 4096); the ``k``-th unit of a
    source is its pool's ``k mod size``-th in the permutation of epoch ``k // size``."""

    def __init__(self, unit_sources: np.ndarray, names: Sequence[str],
                 weights: Mapping[str, float], seed: int):
        weights = parse_mix(weights)
        check_mix(weights, names, "the split")
        self.names = list(weights)
        self.p = np.asarray(list(weights.values()), dtype=np.float64)
        self.p /= self.p.sum()
        self.seed = int(seed)
        self.pools = [np.flatnonzero(np.asarray(unit_sources) == list(names).index(name))
                      for name in self.names]
        for name, pool in zip(self.names, self.pools):
            if len(pool) == 0:
                raise LmlabError(f"source {name!r} holds no complete training example",
                                 "leave it out of --mix or use a shorter --seq-len")
        self._choices: tuple[int, np.ndarray] | None = None
        self._orders: dict[tuple[int, int], np.ndarray] = {}

    def source_of(self, draw: int) -> int:
        """The index (into :attr:`names`) of the source draw number ``draw`` comes from."""
        block = draw // _BLOCK
        if self._choices is None or self._choices[0] != block:
            rng = np.random.default_rng([self.seed, block, 7])
            self._choices = (block, rng.choice(len(self.p), size=_BLOCK, p=self.p))
        return int(self._choices[1][draw % _BLOCK])

    def unit(self, source: int, taken: int) -> tuple[int, int]:
        """(unit, epoch of the source) of the source's ``taken``-th unit (0-based)."""
        pool = self.pools[source]
        epoch, index = divmod(taken, len(pool))
        if (source, epoch) not in self._orders:
            if len(self._orders) > 2 * len(self.pools):
                self._orders.clear()
            rng = np.random.default_rng([self.seed, source, epoch, 8])
            self._orders[source, epoch] = rng.permutation(len(pool))
        return int(pool[self._orders[source, epoch][index]]), epoch
