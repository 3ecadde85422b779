"""Entity-level precision, recall and F1 for BIO / IOB2 tagging (CoNLL-2003 NER), micro-averaged
over entities as ``conlleval`` reports them. Chunking is ``conlleval`` (lenient: a stray ``I-``
opens an entity) or IOB2 ``strict`` (seqeval's); docs/metrics.md compares the two.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from lmlab.metrics.classification import prf_from_counts
from lmlab.utils.checks import check_choice
from lmlab.utils.errors import LmlabError

Entity = tuple[str, int, int]  # (type, start, end) with end exclusive
MODES = ("conlleval", "strict")


def _split_tag(tag: str) -> tuple[str, str]:
    """('B'|'I'|'O', type). Accepts ``B-PER``, ``I-PER``, ``O`` (and ``B_PER`` spellings)."""
    if tag == "O" or tag == "":
        return "O", ""
    if len(tag) > 2 and tag[1] in "-_" and tag[0] in "BI":
        return tag[0], tag[2:]
    raise LmlabError(f"tag {tag!r} is not a BIO tag",
                     "use O, B-TYPE or I-TYPE (IOB2 / BIO scheme, e.g. B-PER, I-LOC)")


def get_entities(tags: Sequence[str], mode: str = "conlleval") -> list[Entity]:
    """The entities in one tag sequence as ``(type, start, end)`` (end exclusive)."""
    check_choice(mode, MODES, "mode", "chunking mode")
    entities: list[Entity] = []
    start: int | None = None
    current = ""
    for i, tag in enumerate(tags):
        prefix, kind = _split_tag(tag)
        continues = start is not None and prefix == "I" and kind == current
        if continues:
            continue
        if start is not None:  # the open entity ends before this token
            entities.append((current, start, i))
            start = None
        if prefix == "B" or (prefix == "I" and mode == "conlleval"):
            start, current = i, kind
    if start is not None:
        entities.append((current, start, len(tags)))
    return entities


def entity_scores(predictions: Sequence[Sequence[str]], references: Sequence[Sequence[str]],
                  mode: str = "conlleval") -> dict[str, float | dict[str, dict[str, float]]]:
    """Micro precision/recall/F1 over the entities of all sentences (tag sequences, one per
    sentence, chunked by ``mode``), token ``accuracy``, the counts ``n_pred``/``n_gold``/
    ``n_correct`` and ``per_type`` {type: {precision, recall, f1, support}}."""
    if len(predictions) != len(references):
        raise LmlabError(f"{len(predictions)} predicted sentences for {len(references)} gold ones",
                         "pass one tag sequence per sentence")
    if not references:
        raise LmlabError("no sentences to score (the evaluation set is empty)",
                         "evaluate on a split that has at least one sentence")
    pred_count: Counter[str] = Counter()
    gold_count: Counter[str] = Counter()
    correct_count: Counter[str] = Counter()
    tokens = correct_tokens = 0
    for index, (pred_tags, gold_tags) in enumerate(zip(predictions, references)):
        if len(pred_tags) != len(gold_tags):
            raise LmlabError(f"sentence {index}: {len(pred_tags)} predicted tags for "
                             f"{len(gold_tags)} tokens", "predict one tag per token")
        pred_entities = set(get_entities(pred_tags, mode))
        gold_entities = set(get_entities(gold_tags, mode))
        pred_count.update(e[0] for e in pred_entities)
        gold_count.update(e[0] for e in gold_entities)
        correct_count.update(e[0] for e in pred_entities & gold_entities)
        tokens += len(gold_tags)
        correct_tokens += sum(p == g for p, g in zip(pred_tags, gold_tags))

    n_pred, n_gold, n_correct = (sum(c.values()) for c in (pred_count, gold_count, correct_count))
    precision, recall, f1 = prf_from_counts(n_correct, n_pred, n_gold)
    per_type = {}
    for kind in sorted(set(pred_count) | set(gold_count)):
        p, r, f = prf_from_counts(correct_count[kind], pred_count[kind], gold_count[kind])
        per_type[kind] = {"precision": p, "recall": r, "f1": f, "support": float(gold_count[kind])}
    return {"precision": precision, "recall": recall, "f1": f1,
            "accuracy": correct_tokens / tokens if tokens else 0.0,
            "n_pred": float(n_pred), "n_gold": float(n_gold), "n_correct": float(n_correct),
            "per_type": per_type}
