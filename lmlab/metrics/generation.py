"""Metrics of generated text: corpus BLEU and chrF by sacrebleu (its defaults, the numbers papers
report; docs/metrics.md) as fractions, and sequence accuracy. ``references`` are one string per
prediction, or a list per prediction (the same number for every one).
"""

from __future__ import annotations

from collections.abc import Sequence

from lmlab.utils.errors import LmlabError


def _reference_streams(predictions: Sequence[str],
                       references: Sequence[str] | Sequence[Sequence[str]]) -> list[list[str]]:
    """sacrebleu's layout: one list per reference *set*, each aligned with the predictions."""
    if len(predictions) != len(references):
        raise LmlabError(f"{len(predictions)} predictions for {len(references)} references",
                         "pass one prediction per example")
    if not predictions:
        raise LmlabError("no predictions to score", "pass at least one prediction")
    per_example = [list(r) if isinstance(r, (list, tuple)) else [r] for r in references]
    if not all(isinstance(p, str) for p in predictions) or not all(
            isinstance(r, str) for refs in per_example for r in refs):
        raise LmlabError("BLEU, chrF and sequence accuracy score text: predictions and "
                         "references must be strings", "decode the token ids to text first")
    counts = {len(r) for r in per_example}
    if len(counts) != 1 or 0 in counts:
        raise LmlabError(f"every prediction needs the same number of references (got {counts})",
                         "give each example one reference, or the same number of them")
    return [list(stream) for stream in zip(*per_example)]


def bleu(predictions: Sequence[str], references: Sequence[str] | Sequence[Sequence[str]]) -> float:
    """Corpus BLEU (sacrebleu's defaults) as a fraction."""
    import sacrebleu  # a dependency of lmlab, imported when used

    streams = _reference_streams(predictions, references)
    return sacrebleu.corpus_bleu(list(predictions), streams).score / 100.0


def chrf(predictions: Sequence[str], references: Sequence[str] | Sequence[Sequence[str]]) -> float:
    """Corpus chrF (sacrebleu's defaults: character 6-grams, beta 2) as a fraction."""
    import sacrebleu

    streams = _reference_streams(predictions, references)
    return sacrebleu.corpus_chrf(list(predictions), streams).score / 100.0


def sequence_accuracy(predictions: Sequence[str],
                      references: Sequence[str] | Sequence[Sequence[str]]) -> float:
    """The fraction of predictions equal to (one of) their reference(s), whitespace runs
    collapsed: exact match for generated sequences (not SQuAD's normalised answer match)."""
    streams = _reference_streams(predictions, references)
    norm = " ".join
    hits = sum(any(norm(p.split()) == norm(stream[i].split()) for stream in streams)
               for i, p in enumerate(predictions))
    return hits / len(predictions)
