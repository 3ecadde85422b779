"""SQuAD v1.1 / v2.0 exact match and F1 as the official evaluation scripts compute them (their
answer normalisation and unanswerable-question rule: docs/metrics.md), as fractions.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence

from lmlab.utils.errors import LmlabError

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation and articles, and collapse whitespace (official order)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    """Bag-of-tokens F1 between normalised prediction and gold (SQuAD 2.0 rule for empties:
    if either side has no tokens, 1.0 when both are empty, else 0.0)."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    common = Counter(pred_tokens) & Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def gold_answers(answers: Sequence[str]) -> list[str]:
    """The gold answers a prediction is compared with: the non-empty ones, or ``[""]`` for an
    unanswerable (SQuAD 2.0) question."""
    kept = [a for a in answers if normalize_answer(a)]
    return kept or [""]


def squad_scores(prediction: str, answers: Sequence[str]) -> tuple[float, float]:
    """(exact match, F1) of one prediction: the maximum over the gold answers."""
    golds = gold_answers(answers)
    return (max(exact_match(prediction, g) for g in golds),
            max(token_f1(prediction, g) for g in golds))


def squad_evaluate(predictions: Mapping[str, str],
                   references: Mapping[str, Sequence[str]]) -> dict[str, float]:
    """Corpus EM/F1 of ``predictions`` (id -> answer, "" = none) against ``references`` (id ->
    gold answers, [] = unanswerable): ``exact_match``, ``f1``, ``total``, ``missing`` (ids
    without a prediction, scored 0 as the official script does), and ``has_ans_*``/``no_ans_*``
    when both kinds of question are present."""
    if not references:
        raise LmlabError("no questions to score (the evaluation set is empty)",
                         "evaluate on a split that has at least one question")
    groups: dict[str, list[tuple[float, float]]] = {"all": [], "has_ans": [], "no_ans": []}
    missing = 0
    for qid, answers in references.items():
        has_answer = gold_answers(answers) != [""]
        if qid in predictions:
            em, f1 = squad_scores(predictions[qid], answers)
        else:
            em, f1, missing = 0.0, 0.0, missing + 1
        groups["all"].append((em, f1))
        groups["has_ans" if has_answer else "no_ans"].append((em, f1))
    result: dict[str, float] = {}
    for name, scores in groups.items():
        if not scores or (name != "all" and not (groups["has_ans"] and groups["no_ans"])):
            continue
        prefix = "" if name == "all" else f"{name}_"
        result[f"{prefix}exact_match"] = sum(s[0] for s in scores) / len(scores)
        result[f"{prefix}f1"] = sum(s[1] for s in scores) / len(scores)
        result[f"{prefix}total"] = float(len(scores))
    result["missing"] = float(missing)
    return result
