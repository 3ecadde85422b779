"""BLEU, chrF (through sacrebleu) and sequence accuracy (lmlab.metrics.generation)."""

from __future__ import annotations

import pytest

from lmlab.metrics import compute_metrics
from lmlab.metrics.generation import bleu, chrf, sequence_accuracy
from lmlab.utils.errors import LmlabError

# sacrebleu's README example: three hypotheses, two reference sets; BLEU 48.53
HYPOTHESES = ["The dog bit the man.", "It wasn't surprising.", "The man had just bitten him."]
REFERENCES = [["The dog bit the man.", "The dog had bit the man."],
              ["It was not unexpected.", "No one was surprised."],
              ["The man bit him first.", "The man had bitten the dog."]]


def test_bleu_matches_the_published_example():
    assert bleu(HYPOTHESES, REFERENCES) == pytest.approx(0.4853, abs=1e-4)  # tol: published to 4 decimals


def test_identical_text_scores_one_and_unrelated_text_low():
    refs = ["a cat sat on the mat", "the quick brown fox jumps"]
    assert bleu(refs, refs) == pytest.approx(1.0)
    assert chrf(refs, refs) == pytest.approx(1.0)
    assert chrf(["zzz qqq", "xxx"], refs) < 0.05
    assert 0.0 < chrf(["a cat sat on a mat", "the quick fox"], refs) < 1.0


def test_sequence_accuracy_counts_exact_outputs():
    assert sequence_accuracy(["add x  INT+ 1", "x"], ["add x INT+ 1", "mul x x"]) == 0.5
    assert sequence_accuracy(["b"], [["a", "b"]]) == 1.0


def test_compute_metrics_knows_them():
    scores = compute_metrics(["bleu", "chrf", "sequence_accuracy"], HYPOTHESES,
                             [r[0] for r in REFERENCES])
    assert set(scores) == {"bleu", "chrf", "sequence_accuracy"}
    assert scores["sequence_accuracy"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("predictions,references,match", [
    (["a"], ["a", "b"], "1 predictions for 2 references"),
    ([], [], "no predictions"),
    (["a", "b"], [["a"], ["b", "c"]], "same number of references"),
    ([1], [1], "must be strings"),
])
def test_bad_input_is_a_clear_error(predictions, references, match):
    with pytest.raises(LmlabError, match=match):
        bleu(predictions, references)
