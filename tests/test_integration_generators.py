"""The integration generators (lmlab.tasks.integration_data): backward, forward (sympy under a
time limit) and integration by parts, each giving pairs whose reference verifies; Lample &
Charton's uniform trees and grammar; resuming a generation from its checkpoint."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import sympy

from lmlab.tasks.integration import (
    FUNCTIONS,
    PAPER_GRAMMAR,
    Grammar,
    _function_of_constant,
    _tree_counts,
    _uniform_tree,
    fingerprint,
    from_prefix,
    verify,
)
from lmlab.tasks.integration_data import generate_pairs
from lmlab.tasks.inverse import read_task_data, task_info, write_task_data
from lmlab.utils.errors import LmlabError

x = sympy.Symbol("x")
EASY = Grammar(max_ops=2, max_depth=2)  # integrals sympy finds in well under a second


def _check(pairs):
    """One pair per function, each reference an antiderivative of its input."""
    assert len({p.key for p in pairs}) == len(pairs)
    for pair in pairs:
        assert fingerprint(from_prefix(pair.input_text.split())) == pair.key
        assert verify(pair.target, pair.input_text, timeout=10).correct, pair


def test_forward_pairs_integrate_their_input():
    pairs = generate_pairs(6, seed=0, grammar=EASY, generator="fwd", timeout=5.0)
    _check(pairs)


def test_by_parts_pairs_are_deterministic_and_verify():
    pairs = generate_pairs(6, seed=1, grammar=EASY, generator="ibp")
    assert pairs == generate_pairs(6, seed=1, grammar=EASY, generator="ibp")
    _check(pairs)


@pytest.mark.parametrize("generator", ["bwd", "ibp"])
def test_a_generation_continues_from_its_checkpoint(tmp_path, generator):
    """Stopped at 5 pairs and continued to 10, it gives what one run of 10 gives."""
    checkpoint = tmp_path / "generation.json"
    first = generate_pairs(5, seed=2, grammar=EASY, generator=generator, checkpoint=checkpoint)
    whole = generate_pairs(10, seed=2, grammar=EASY, generator=generator)
    assert first == whole[:5]
    assert generate_pairs(10, seed=2, grammar=EASY, generator=generator,
                          checkpoint=checkpoint) == whole
    with pytest.raises(LmlabError, match=r"other settings \(seed"):
        generate_pairs(12, seed=3, grammar=EASY, generator=generator, checkpoint=checkpoint)


def test_uniform_trees_are_uniform():
    """Lample & Charton's counts D(e, n): with one unary and one binary operator, the trees of
    n operators are the large Schroeder numbers; drawn trees of 2 operators (2 unary and 1
    binary: 12 labelled shapes) come out equally often."""
    assert [_tree_counts(5, 1, 1)[1][n] for n in range(6)] == [1, 2, 6, 22, 90, 394]
    grammar = Grammar(unary=("exp", "sin"), binary=("add",), uniform=True, p_x=1.0)
    rng = np.random.default_rng(0)
    seen = Counter(" ".join(_uniform_tree(rng, grammar, 2)) for _ in range(6000))
    assert len(seen) == 12 and max(seen.values()) < 1.25 * min(seen.values())


def test_the_papers_grammar():
    assert len(FUNCTIONS) == 15 and set(PAPER_GRAMMAR.unary) == set(FUNCTIONS)
    assert PAPER_GRAMMAR.max_ops == 15 and "div" in PAPER_GRAMMAR.binary
    pairs = generate_pairs(2, seed=0, grammar=PAPER_GRAMMAR, timeout=10.0)
    _check(pairs)
    # trees with a function of a constant (atanh(4): sympy crawls on them) are drawn again
    assert _function_of_constant("add x sin add INT+ 3 INT+ 1 2".split())
    assert not _function_of_constant("sin add x INT+ 3".split())
    with pytest.raises(LmlabError, match="not in the prefix vocabulary"):
        Grammar(unary=("erf",))
    with pytest.raises(LmlabError, match="uniform trees take no pow"):
        Grammar(uniform=True)


def test_task_folder_records_the_generation_and_resumes(tmp_path):
    """A killed generation leaves generation.json: the same command continues it."""
    options = {"generator": "ibp", "max_ops": 2}
    write_task_data("integration", tmp_path / "whole", count=12, seed=0, **options)
    info = task_info(tmp_path / "whole")
    assert info["generation"] == {"generator": "ibp", "grammar": "small", "max_ops": 2}
    assert info["skipped_draws"]["integral-unknown"] > 0
    write_task_data("integration", tmp_path / "killed", count=5, seed=0, **options)
    for name in ("train.jsonl", "dev.jsonl", "test.jsonl", "task.json"):
        (tmp_path / "killed" / name).unlink()  # as if killed before the splits were written
    write_task_data("integration", tmp_path / "killed", count=12, seed=0, **options)
    assert read_task_data(tmp_path / "killed") == read_task_data(tmp_path / "whole")
    with pytest.raises(LmlabError, match="generator does not apply to the definitions task"):
        write_task_data("definitions", tmp_path / "defs", generator="fwd")
    assert json.loads((tmp_path / "whole" / "generation.json").read_text())["settings"][
        "generator"] == "ibp"
