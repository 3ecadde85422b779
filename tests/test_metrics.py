"""Metrics against scikit-learn, scipy, the official SQuAD formulas and published GLUE numbers."""

from __future__ import annotations

import collections
import math
import re
import string

import numpy as np
import pytest
from scipy import stats
from sklearn import metrics as skm

from lmlab.metrics import (
    accuracy,
    bert_glue_average,
    compute_metrics,
    entity_scores,
    f1_score,
    get_entities,
    glue_score,
    matthews_corrcoef,
    normalize_answer,
    pearson,
    perplexity,
    perplexity_from_sums,
    precision_recall_f1,
    spearman,
    squad_evaluate,
    squad_scores,
)
from lmlab.utils.errors import LmlabError

# ----------------------------------------------------------------------------- classification


@pytest.mark.parametrize("n_classes", [2, 3, 7])
def test_accuracy_f1_mcc_match_sklearn(n_classes):
    rng = np.random.default_rng(n_classes)
    for _ in range(20):
        ref = rng.integers(0, n_classes, size=50)
        pred = np.where(rng.random(50) < 0.6, ref, rng.integers(0, n_classes, size=50))
        assert accuracy(pred, ref) == pytest.approx(skm.accuracy_score(ref, pred))
        for average in ("macro", "micro"):
            ours = precision_recall_f1(pred, ref, average=average)
            theirs = skm.precision_recall_fscore_support(ref, pred, average=average,
                                                         zero_division=0)[:3]
            assert ours == pytest.approx(theirs)
        if n_classes == 2:
            assert f1_score(pred, ref) == pytest.approx(skm.f1_score(ref, pred))
        assert matthews_corrcoef(pred, ref) == pytest.approx(skm.matthews_corrcoef(ref, pred))


def test_string_labels_and_degenerate_cases():
    ref = ["entailment", "neutral", "contradiction", "neutral"]
    pred = ["neutral", "neutral", "contradiction", "entailment"]
    assert f1_score(pred, ref, average="macro") == pytest.approx(
        skm.f1_score(ref, pred, average="macro"))
    assert f1_score(["no", "no"], ["yes", "no"], pos_label="yes") == 0.0  # no positive predictions
    assert matthews_corrcoef([1, 1, 1], [0, 1, 1]) == 0.0  # constant prediction, as sklearn
    assert skm.matthews_corrcoef([0, 1, 1], [1, 1, 1]) == 0.0


def test_classification_errors():
    with pytest.raises(LmlabError, match="2 predictions for 3"):
        accuracy([1, 0], [1, 0, 1])
    with pytest.raises(LmlabError, match="empty"):
        accuracy([], [])
    with pytest.raises(LmlabError, match="unknown F1 average"):
        f1_score([1], [1], average="weighted")


def test_pearson_spearman_match_scipy():
    rng = np.random.default_rng(0)
    x = rng.normal(size=200)
    y = x + rng.normal(size=200)
    assert pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0])
    assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0])
    tied_x = np.round(x * 2) / 2  # many ties
    tied_y = np.round(y)
    assert spearman(tied_x, tied_y) == pytest.approx(stats.spearmanr(tied_x, tied_y)[0])
    # ties at their mean rank, worked by hand: ranks [1, 2.5, 2.5, 4] and [1, 3, 2, 4]
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / math.sqrt(4.5 * 5))
    assert pearson([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]) == 0.0  # undefined -> 0
    assert spearman([1.0, 2.0, 3.0], [2.0, 2.0, 2.0]) == 0.0


def test_classification_values_worked_by_hand():
    # tp 2, tn 1, fp 1, fn 0 for label 1; label 0: precision 1, recall 1/2
    pred, ref = [1, 0, 1, 1], [1, 0, 0, 1]
    assert accuracy(pred, ref) == 0.75
    assert precision_recall_f1(pred, ref) == pytest.approx((2 / 3, 1.0, 0.8))
    assert f1_score(pred, ref, average="macro") == pytest.approx((2 / 3 + 0.8) / 2)
    assert f1_score(pred, ref, average="micro") == pytest.approx(0.75)
    assert matthews_corrcoef(pred, ref) == pytest.approx(2 / math.sqrt(3 * 2 * 2 * 1))
    # binary F1 of one label when a prediction is no label at all (a generated text)
    assert f1_score(["same", "x", "same"], ["same", "same", "different"],
                    pos_label="same") == pytest.approx(0.5)


# ----------------------------------------------------------------------------- SQuAD


def _official_normalize(s):  # the official SQuAD evaluation script's normalize_answer
    def remove_articles(text):
        return re.sub(re.compile(r"\b(a|an|the)\b", re.UNICODE), " ", text)

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    return " ".join(remove_articles(remove_punc(s.lower())).split())


def _official_f1(a_gold, a_pred):  # SQuAD 2.0 script's compute_f1
    gold_toks = _official_normalize(a_gold).split() if a_gold else []
    pred_toks = _official_normalize(a_pred).split() if a_pred else []
    common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
    num_same = sum(common.values())
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        return int(gold_toks == pred_toks)
    if num_same == 0:
        return 0
    precision = num_same / len(pred_toks)
    recall = num_same / len(gold_toks)
    return 2 * precision * recall / (precision + recall)


def test_squad_normalisation():
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert normalize_answer("an apple, a pear") == "apple pear"
    assert normalize_answer("theory") == "theory"  # 'the' only as a whole word
    assert normalize_answer("Denver Broncos.") == _official_normalize("Denver Broncos.")


def test_squad_scores_match_official_formulas():
    cases = [
        ("Denver Broncos", ["Denver Broncos", "The Denver Broncos"]),
        ("the Broncos of Denver", ["Denver Broncos"]),
        ("1969", ["July 1969", "1969"]),
        ("Paris", ["London"]),
        ("", ["Paris"]),
        ("", []),  # SQuAD 2.0: unanswerable, empty prediction is right
        ("Paris", []),  # unanswerable, an answer is wrong
        ("a", ["the"]),  # both normalise to empty -> gold [""] and empty pred
    ]
    for prediction, answers in cases:
        golds = [a for a in answers if _official_normalize(a)] or [""]
        expected_em = max(int(_official_normalize(g) == _official_normalize(prediction))
                          for g in golds)
        expected_f1 = max(_official_f1(g, prediction) for g in golds)
        assert squad_scores(prediction, answers) == pytest.approx((expected_em, expected_f1))


def test_squad_evaluate_v2_breakdown():
    refs = {"q1": ["Denver Broncos"], "q2": [], "q3": ["1969"]}
    preds = {"q1": "Broncos", "q2": "", "q3": "1970"}
    result = squad_evaluate(preds, refs)
    assert result["exact_match"] == pytest.approx(1 / 3)
    assert result["f1"] == pytest.approx((2 / 3 + 1 + 0) / 3)
    assert result["has_ans_total"] == 2 and result["no_ans_total"] == 1
    assert result["no_ans_exact_match"] == 1.0
    assert squad_evaluate({}, {"q": ["x"]})["missing"] == 1.0


# ----------------------------------------------------------------------------- tagging


def test_entity_scores_seqeval_documented_example():
    # seqeval's README example: f1 = 0.50 (one of two gold entities found, one of two predicted)
    y_true = [["O", "O", "O", "B-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    y_pred = [["O", "O", "B-MISC", "I-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    scores = entity_scores(y_pred, y_true)
    assert scores["f1"] == pytest.approx(0.5)
    assert scores["precision"] == pytest.approx(0.5) and scores["recall"] == pytest.approx(0.5)


def test_conlleval_lenient_and_strict_chunks():
    tags = ["I-PER", "I-PER", "O", "B-LOC", "I-ORG", "I-ORG", "B-LOC", "B-LOC", "I-LOC"]
    # conlleval: I- after O (or after another type) opens a chunk; B- always opens one
    assert get_entities(tags) == [("PER", 0, 2), ("LOC", 3, 4), ("ORG", 4, 6), ("LOC", 6, 7),
                                  ("LOC", 7, 9)]
    # IOB2 strict: stray I- tokens belong to no entity
    assert get_entities(tags, mode="strict") == [("LOC", 3, 4), ("LOC", 6, 7), ("LOC", 7, 9)]
    gold = [["B-PER", "I-PER", "O"]]
    pred = [["I-PER", "I-PER", "O"]]
    assert entity_scores(pred, gold)["f1"] == 1.0  # conlleval accepts the IOB1-style start
    assert entity_scores(pred, gold, mode="strict")["f1"] == 0.0
    assert compute_metrics(["entity_f1", "strict_entity_f1"], pred, gold) == {
        "entity_f1": 1.0, "strict_entity_f1": 0.0}


def test_entity_scores_counts_and_errors():
    gold = [["B-PER", "I-PER", "O", "B-LOC"]]
    pred = [["B-PER", "O", "O", "B-LOC"]]
    scores = entity_scores(pred, gold)
    assert (scores["n_gold"], scores["n_pred"], scores["n_correct"]) == (2, 2, 1)
    assert scores["per_type"]["LOC"]["f1"] == 1.0 and scores["per_type"]["PER"]["f1"] == 0.0
    assert scores["accuracy"] == pytest.approx(0.75)
    with pytest.raises(LmlabError, match="not a BIO tag"):
        get_entities(["PER"])
    with pytest.raises(LmlabError, match="3 predicted tags for 4 tokens"):
        entity_scores([["O", "O", "O"]], gold)


# ----------------------------------------------------------------------------- perplexity


def test_perplexity():
    assert perplexity(math.log(50.0)) == pytest.approx(50.0)
    assert perplexity_from_sums(3 * math.log(8.0), 3) == pytest.approx(8.0)
    assert perplexity(1e6) == math.inf
    with pytest.raises(LmlabError, match="below 0"):
        perplexity(-1.0)
    with pytest.raises(LmlabError, match="no tokens"):
        perplexity_from_sums(1.0, 0)


# ----------------------------------------------------------------------------- GLUE

BERT_LARGE_LEADERBOARD = {  # GLUE leaderboard row of BERT-large (test set)
    "cola": {"mcc": 60.5}, "sst2": {"accuracy": 94.9},
    "mrpc": {"f1": 89.3, "accuracy": 85.4}, "stsb": {"pearson": 87.6, "spearman": 86.5},
    "qqp": {"f1": 72.1, "accuracy": 89.3}, "mnli-m": {"accuracy": 86.7},
    "mnli-mm": {"accuracy": 85.9}, "qnli": {"accuracy": 92.7}, "rte": {"accuracy": 70.1},
    "wnli": {"accuracy": 65.1},
}


def test_glue_score_reproduces_bert_large_80_5():
    assert round(glue_score(BERT_LARGE_LEADERBOARD), 1) == 80.5


def test_bert_paper_average_reproduces_table_1():
    def table_row(m, mm, qqp, qnli, sst2, cola, stsb, mrpc, rte):
        return {"mnli-m": {"accuracy": m}, "mnli-mm": {"accuracy": mm}, "qqp": {"f1": qqp},
                "qnli": {"accuracy": qnli}, "sst2": {"accuracy": sst2}, "cola": {"mcc": cola},
                "stsb": {"spearman": stsb}, "mrpc": {"f1": mrpc}, "rte": {"accuracy": rte}}

    base = table_row(84.6, 83.4, 71.2, 90.5, 93.5, 52.1, 85.8, 88.9, 66.4)
    large = table_row(86.7, 85.9, 72.1, 92.7, 94.9, 60.5, 86.5, 89.3, 70.1)
    assert round(bert_glue_average(base), 1) == 79.6
    assert round(bert_glue_average(large), 1) == 82.1


def test_glue_missing_task_and_partial():
    partial = {"rte": {"accuracy": 0.7}, "mrpc": {"f1": 0.9, "accuracy": 0.8}}
    with pytest.raises(LmlabError, match="no entry for 'cola'"):
        glue_score(partial)
    assert glue_score(partial, partial=True) == pytest.approx((0.7 + 0.85) / 2)
    with pytest.raises(LmlabError, match="no 'f1'"):
        glue_score({**BERT_LARGE_LEADERBOARD, "qqp": {"accuracy": 89.3}})


def test_compute_metrics_unknown_name():
    with pytest.raises(LmlabError, match="unknown metric 'rouge'"):
        compute_metrics(["rouge"], [1], [1])
