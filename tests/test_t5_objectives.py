"""T5's span corruption and its objective study (lmlab.objectives.t5_spans): the statistics of
the noise mask, the sentinel layout (the paper's own example), and each objective's invariants,
on real text (KJV, MiniLM's WordPiece; its [unused0..98] pieces stand in for the sentinels)."""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
from conftest import minilm_raw_tokenizer

from lmlab.objectives.t5_spans import (
    OBJECTIVES,
    Tokens,
    corrupt_with_sentinels,
    get_objective,
    random_spans_noise_mask,
    span_corruption,
)
from lmlab.utils.errors import LmlabError

SENTINELS = list(range(1, 100))  # [unused0] ... in BERT's vocabulary: never in the text


@functools.lru_cache(maxsize=1)
def _windows(length: int = 512) -> tuple[list[np.ndarray], int]:
    """KJV text cut into windows of ``length`` ids; the [MASK] id."""
    from lmlab.text.sources.kjv import KJVSource

    tokenizer = minilm_raw_tokenizer()
    ids = np.concatenate([np.asarray(tokenizer.encode(" ".join(d.sentences),
                                                      add_special_tokens=False).ids)
                          for d in itertools.islice(KJVSource().iter_documents(), 200)])
    windows = [ids[i:i + length] for i in range(0, len(ids) - length, length)]
    return windows, tokenizer.token_to_id("[MASK]")


def _refill(inputs: np.ndarray, targets: np.ndarray) -> list[int]:
    """The original text back from span-corruption inputs and targets: each input sentinel
    replaced by what follows the same sentinel in the targets."""
    spans, current = {}, None
    for token in targets.tolist():
        if token in SENTINELS:
            current = token
            spans[current] = []
        else:
            spans[current].append(token)
    out = []
    for token in inputs.tolist():
        out.extend(spans[token] if token in SENTINELS else [token])
    return out


def test_noise_mask_statistics_on_512_token_windows():
    windows, _ = _windows()
    assert len(windows) >= 40
    rng = np.random.default_rng(0)
    densities, span_lengths, first_noise = [], [], []
    for window in windows:
        mask = random_spans_noise_mask(len(window), rng)
        starts = np.flatnonzero(mask & ~np.concatenate([[False], mask[:-1]]))
        ends = np.flatnonzero(mask & ~np.concatenate([mask[1:], [False]]))
        densities.append(mask.mean())
        span_lengths += (ends - starts + 1).tolist()
        first_noise.append(mask[0])
        assert mask.sum() == round(512 * 0.15) == 77  # T5 fixes the count, not just the rate
        assert len(starts) == round(77 / 3)
    assert np.mean(densities) == pytest.approx(0.15, abs=0.001)  # tol: 77 / 512 = 0.1504
    assert np.mean(span_lengths) == pytest.approx(77 / 26, abs=1e-9)  # mean 3 by construction
    assert min(span_lengths) >= 1 and max(span_lengths) > 3  # random lengths, not all 3
    assert not any(first_noise)  # T5's mask starts with a non-noise span


def test_the_papers_example():
    """Figure 2 of the T5 paper: "Thank you for inviting me to your party last week."."""
    words = "Thank you for inviting me to your party last week .".split()
    ids = np.arange(100, 100 + len(words))
    noise = np.isin(words, ["for", "inviting", "last"])
    example = corrupt_with_sentinels(ids, noise, [1, 2, 3])
    name = dict(zip(ids.tolist(), words)) | {1: "<X>", 2: "<Y>", 3: "<Z>"}
    assert " ".join(name[t] for t in example.inputs.tolist()) == \
        "Thank you <X> me to your party <Y> week ."
    assert " ".join(name[t] for t in example.targets.tolist()) == "<X> for inviting <Y> last <Z>"


def test_span_corruption_round_trips_and_numbers_sentinels_in_order():
    windows, _ = _windows()
    rng = np.random.default_rng(1)
    for window in windows[:20]:
        example = span_corruption(window, Tokens(sentinels=SENTINELS), rng)
        used = [t for t in example.inputs.tolist() if t in SENTINELS]
        assert used == SENTINELS[:len(used)]  # <extra_id_0>, <extra_id_1>, ... in order
        assert example.targets[0] == SENTINELS[0]
        assert _refill(example.inputs, example.targets) == window.tolist()
        assert len(example.inputs) + len(example.targets) < 1.3 * len(window)


def test_too_few_sentinels_is_a_clear_error():
    windows, _ = _windows()
    with pytest.raises(LmlabError, match="more than 3 sentinel tokens"):
        span_corruption(windows[0], Tokens(sentinels=[1, 2, 3]), np.random.default_rng(2))
    with pytest.raises(LmlabError, match="no sentinel tokens"):
        span_corruption(windows[0], Tokens(), np.random.default_rng(2))


def test_every_objective_of_the_study_keeps_its_invariant():
    windows, mask_id = _windows()
    tokens = Tokens(sentinels=SENTINELS, mask_id=mask_id, vocab_size=30522)
    window = windows[3]
    original = window.tolist()
    rng = np.random.default_rng(3)
    examples = {name: get_objective(name)(window, tokens, rng) for name in OBJECTIVES}

    prefix = examples["prefix_lm"]
    assert prefix.inputs.tolist() + prefix.targets.tolist() == original
    assert len(prefix.inputs) and len(prefix.targets)
    for name in ("bert_style", "mass_style", "deshuffling"):
        assert examples[name].targets.tolist() == original, name  # full reconstruction
    bert = examples["bert_style"].inputs
    changed = bert != window
    assert changed.mean() == pytest.approx(0.15, abs=0.05)  # tol: sampling, one window
    assert (bert[changed] == mask_id).mean() == pytest.approx(0.9, abs=0.1)  # tol: sampling, one window
    mass = examples["mass_style"].inputs
    assert (mass[mass != window] == mask_id).all() and (mass != window).any()
    assert sorted(examples["deshuffling"].inputs.tolist()) == sorted(original)
    assert examples["deshuffling"].inputs.tolist() != original
    for name in ("drop_tokens", "drop_spans"):
        dropped = examples[name]
        assert len(dropped.inputs) + len(dropped.targets) == len(window), name
        assert not set(SENTINELS) & set(dropped.inputs.tolist())
    assert len(examples["drop_spans"].targets) == 77


def test_objectives_that_need_a_mask_say_so():
    window = _windows()[0][0]
    with pytest.raises(LmlabError, match="needs a mask token"):
        get_objective("mass_style")(window, Tokens(), np.random.default_rng(4))
    with pytest.raises(LmlabError, match="unknown T5 objective 'bart'"):
        get_objective("bart")


def test_replace_spans_merges_iid_noise_runs_into_sentinels():
    """i.i.d. noise (Table 4): about 15% of the tokens, each run of them one sentinel; where the
    text starts with kept tokens, the targets refill the inputs exactly."""
    windows, _ = _windows()
    rng = np.random.default_rng(5)
    refilled = noise = 0
    for window in windows[:20]:
        example = get_objective("replace_spans")(window, Tokens(sentinels=SENTINELS), rng)
        noise += sum(1 for t in example.targets.tolist() if t not in SENTINELS)
        if example.inputs[0] not in SENTINELS:
            assert _refill(example.inputs, example.targets) == window.tolist()
            refilled += 1
    assert refilled >= 10
    assert noise / (20 * 512) == pytest.approx(0.15, abs=0.02)  # tol: sampling, 20 windows
