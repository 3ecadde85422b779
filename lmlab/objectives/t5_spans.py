"""T5's span corruption (Raffel et al. 2020, Section 3.1.4) and the other rows of its objective
study (Section 3.3, :data:`OBJECTIVES`), as (inputs, targets) token-id pairs, one function of
one signature each (docs/objectives.md)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from lmlab.utils.checks import check_choice
from lmlab.utils.errors import LmlabError


@dataclass(frozen=True)
class Example:
    """One text-to-text training pair (token ids, no end-of-sequence token)."""

    inputs: np.ndarray
    targets: np.ndarray


def _random_segmentation(items: int, segments: int, rng: np.random.Generator) -> np.ndarray:
    """A uniformly random split of ``items`` into ``segments`` non-empty parts (their lengths)."""
    first = np.zeros(items, dtype=np.int64)
    first[1:] = rng.permutation(np.arange(items - 1) < segments - 1)
    segment = np.cumsum(first)  # (items,) the segment of each item
    return np.bincount(segment, minlength=segments)


def random_spans_noise_mask(length: int, rng: np.random.Generator, noise_density: float = 0.15,
                            mean_span: float = 3.0) -> np.ndarray:
    """T5's noise mask (length,), True on noise: ``round(length * density)`` noise tokens in
    ``round(noise / mean_span)`` spans, both split uniformly at random into non-empty segments
    that alternate, starting with a non-noise one."""
    if not 0.0 < noise_density < 1.0:
        raise LmlabError(f"noise_density {noise_density} must be between 0 and 1 (exclusive)",
                         "T5 used 0.15")
    if mean_span < 1:
        raise LmlabError(f"mean_span {mean_span} must be at least 1", "T5 used 3")
    padded = max(length, 2)
    noise = min(max(int(round(padded * noise_density)), 1), padded - 1)
    spans = max(int(round(noise / mean_span)), 1)
    spans = min(spans, noise, padded - noise)
    noise_lengths = _random_segmentation(noise, spans, rng)
    kept_lengths = _random_segmentation(padded - noise, spans, rng)
    mask = np.zeros(padded, dtype=bool)
    position = 0
    for kept, noisy in zip(kept_lengths, noise_lengths):
        position += int(kept)
        mask[position:position + int(noisy)] = True
        position += int(noisy)
    return mask[:length]


def _sentinel_runs(ids: np.ndarray, mask: np.ndarray, sentinels: Sequence[int]) -> np.ndarray:
    """``ids`` with each run of True in ``mask`` replaced by the next sentinel."""
    out: list[int] = []
    used = 0
    previous = False
    for token, noisy in zip(ids.tolist(), mask.tolist()):
        if noisy and not previous:
            if used == len(sentinels):
                raise LmlabError(f"the text needs more than {len(sentinels)} sentinel tokens",
                                 "shorten the inputs, or give more sentinels (T5 has 100)")
            out.append(int(sentinels[used]))
            used += 1
        elif not noisy:
            out.append(token)
        previous = noisy
    return np.asarray(out, dtype=ids.dtype)


def corrupt_with_sentinels(ids: np.ndarray, mask: np.ndarray,
                           sentinels: Sequence[int]) -> Example:
    """T5's ``noise_span_to_unique_sentinel`` / ``nonnoise_span_to_unique_sentinel``: inputs
    with every noise run, targets with every non-noise run, replaced by the next sentinel (so
    when the text starts with non-noise, target sentinel i precedes what input sentinel i hides)."""
    ids, mask = np.asarray(ids), np.asarray(mask, dtype=bool)
    if not len(sentinels):
        raise LmlabError("no sentinel tokens were given",
                         "use a tokenizer with sentinels (T5's <extra_id_N>) or add them")
    return Example(_sentinel_runs(ids, mask, sentinels), _sentinel_runs(ids, ~mask, sentinels))


# -- the objectives --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tokens:
    """The special ids the objectives need: ``sentinels`` in order, the mask token (BERT- and
    MASS-style; T5's code uses its first sentinel), and the vocabulary size (random
    replacements)."""

    sentinels: Sequence[int] = ()
    mask_id: int | None = None
    vocab_size: int | None = None


def span_corruption(ids: np.ndarray, tokens: Tokens, rng: np.random.Generator,
                    noise_density: float = 0.15, mean_span: float = 3.0) -> Example:
    """T5's objective: :func:`random_spans_noise_mask`, one sentinel per span."""
    return corrupt_with_sentinels(ids, random_spans_noise_mask(len(ids), rng, noise_density,
                                                               mean_span), tokens.sentinels)


def replace_spans(ids: np.ndarray, tokens: Tokens, rng: np.random.Generator,
                  noise_density: float = 0.15, mean_span: float = 3.0) -> Example:
    """i.i.d. noise tokens, each run one sentinel (Table 4)."""
    return corrupt_with_sentinels(ids, rng.random(len(ids)) < noise_density, tokens.sentinels)


def drop_tokens(ids: np.ndarray, tokens: Tokens, rng: np.random.Generator,
                noise_density: float = 0.15, mean_span: float = 3.0) -> Example:
    """i.i.d. noise tokens dropped; the targets are the dropped tokens (Table 4)."""
    ids = np.asarray(ids)
    mask = rng.random(len(ids)) < noise_density
    return Example(ids[~mask], ids[mask])


def drop_spans(ids: np.ndarray, tokens: Tokens, rng: np.random.Generator,
               noise_density: float = 0.15, mean_span: float = 3.0) -> Example:
    """Span corruption's spans dropped without sentinels; the targets are the spans."""
    ids = np.asarray(ids)
    mask = random_spans_noise_mask(len(ids), rng, noise_density, mean_span)
    return Example(ids[~mask], ids[mask])


def prefix_lm(ids: np.ndarray, tokens: Tokens, rng: np.random.Generator,
              noise_density: float = 0.15, mean_span: float = 3.0) -> Example:
    """A random split point: the prefix in, the rest out (Table 3)."""
    ids = np.asarray(ids)
    split = int(rng.integers(1, len(ids))) if len(ids) > 1 else len(ids)
    return Example(ids[:split], ids[split:])


def _need_mask(tokens: Tokens, name: str) -> int:
    if tokens.mask_id is None:
        raise LmlabError(f"the {name} objective needs a mask token",
                         "give Tokens(mask_id=...): T5 masks with its first sentinel")
    return tokens.mask_id


def bert_style(ids: np.ndarray, tokens: Tokens, rng: np.random.Generator,
               noise_density: float = 0.15, mean_span: float = 3.0) -> Example:
    """15% corrupted (90% mask, 10% random), full reconstruction (Table 3)."""
    mask_id = _need_mask(tokens, "bert_style")
    if tokens.vocab_size is None:
        raise LmlabError("the bert_style objective needs the vocabulary size",
                         "give Tokens(vocab_size=...)")
    ids = np.asarray(ids)
    inputs = ids.copy()
    chosen = rng.random(len(ids)) < noise_density
    random = chosen & (rng.random(len(ids)) < 0.1)
    inputs[chosen & ~random] = mask_id
    inputs[random] = rng.integers(tokens.vocab_size, size=int(random.sum()))
    return Example(inputs, ids.copy())


def mass_style(ids: np.ndarray, tokens: Tokens, rng: np.random.Generator,
               noise_density: float = 0.15, mean_span: float = 3.0) -> Example:
    """15% replaced by the mask token, full reconstruction (Table 4)."""
    ids = np.asarray(ids)
    inputs = ids.copy()
    inputs[rng.random(len(ids)) < noise_density] = _need_mask(tokens, "mass_style")
    return Example(inputs, ids.copy())


def deshuffling(ids: np.ndarray, tokens: Tokens, rng: np.random.Generator,
                noise_density: float = 0.15, mean_span: float = 3.0) -> Example:
    """The tokens shuffled, the original order out (Table 3)."""
    ids = np.asarray(ids)
    return Example(rng.permutation(ids), ids.copy())


Objective = Callable[..., Example]
OBJECTIVES: dict[str, Objective] = {
    "span_corruption": span_corruption, "prefix_lm": prefix_lm, "bert_style": bert_style,
    "mass_style": mass_style, "deshuffling": deshuffling, "replace_spans": replace_spans,
    "drop_tokens": drop_tokens, "drop_spans": drop_spans,
}


def get_objective(name: str) -> Objective:
    """One of :data:`OBJECTIVES` by name, or a clear error naming them."""
    return OBJECTIVES[check_choice(name, OBJECTIVES, "variant", "T5 objective")]
