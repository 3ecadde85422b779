"""Sentence-BERT's regression (cosine MSE) and triplet objectives: loss and gradients equal
sentence-transformers' ``CosineSimilarityLoss`` and ``TripletLoss`` on all-MiniLM-L6-v2, the
triplets built from pairs, training through the CLI, and refusals before any work."""

from __future__ import annotations

import json

import pytest
import torch

from lmlab.sentence.data import PairStream, collate_columns, encode_texts, triplets_of
from lmlab.sentence.encoder import SentenceEncoder
from lmlab.sentence.objectives import CosineRegression, Triplet
from lmlab.sentence.pairs import SentencePair, read_pairs
from lmlab.utils.errors import LmlabError
from tests.conftest import assert_clean_refusal, assert_close_rounding, run_lmlab_here
from tests.test_sentence_encoders import ANCHORS, NEGATIVES, POSITIVES  # the same sentences

SCORES = [0.9, 0.75, 0.2, -0.3]
# (ours, theirs) parameter names whose gradients are compared: first, middle and last weights
PARAMETERS = [("transformer.embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight"),
              ("transformer.layers.0.attention.q_proj.weight",
               "encoder.layer.0.attention.self.query.weight"),
              ("transformer.layers.5.ffn_norm.weight", "encoder.layer.5.output.LayerNorm.weight")]


@pytest.fixture(scope="module")
def models(minilm_dir):
    """(our encoder, sentence-transformers' model) of the same checkpoint, dropout off."""
    st = pytest.importorskip("sentence_transformers")
    theirs = st.SentenceTransformer(str(minilm_dir), device="cpu")
    ours = SentenceEncoder.load(minilm_dir)
    theirs.eval()
    ours.model.eval()
    return ours, theirs


@pytest.fixture(scope="module")
def vectors(models):
    """MiniLM's vectors of the anchors, positives and negatives."""
    with torch.no_grad():
        return [models[0].encode(c) for c in (ANCHORS, POSITIVES, NEGATIVES)]


def _st_losses():
    from sentence_transformers import losses

    return losses


def _compare(models, our_loss, their_loss, columns, scores=None):
    """Loss and gradients of ours against theirs on ``columns`` (lists of texts)."""
    ours, theirs = models
    ids = [encode_texts(ours.tokenizer, c, ours.max_length) for c in columns]
    batch = collate_columns(ids, [0] * len(columns[0]), list(range(len(ids) * len(columns[0]))),
                            ours.tokenizer.pad_token_id)
    batch["scores"] = torch.tensor(scores or [0.0] * len(columns[0]))
    ours.model.zero_grad()
    theirs.zero_grad()
    got = our_loss.compute_loss(ours.model, batch).loss
    expected = their_loss([theirs.tokenize(c) for c in columns],
                          torch.tensor(scores) if scores else None)
    got.backward()
    expected.backward()
    assert_close_rounding(got, expected, terms=384, depth=6, scale=max(1.0, float(expected.detach())))
    mine = dict(ours.model.named_parameters())
    reference = dict(theirs[0].auto_model.named_parameters())
    for name, their_name in PARAMETERS:
        g, e = mine[name].grad, reference[their_name].grad
        assert g is not None and float(e.abs().max()) > 0
        # the backward pass through 6 layers: a relative bound on the largest gradient entry
        torch.testing.assert_close(g, e, atol=2e-5 * float(e.abs().max()) + 1e-8, rtol=0)
    return float(got.detach())


@pytest.mark.numerics
def test_cosine_regression_matches_sentence_transformers(models):
    loss = _compare(models, CosineRegression(normalize=True),
                    _st_losses().CosineSimilarityLoss(models[1]), [ANCHORS, POSITIVES], SCORES)
    assert loss > 1e-3  # the scores are not what MiniLM says: the gradients are not zero


@pytest.mark.numerics
def test_triplet_matches_sentence_transformers(models):
    """The paper's default (Euclidean, margin 5: on MiniLM's unit vectors every triplet counts)
    through both encoders' backward passes."""
    _compare(models, Triplet(normalize=True), _st_losses().TripletLoss(models[1]),
             [ANCHORS, POSITIVES, NEGATIVES])


@pytest.mark.numerics
@pytest.mark.parametrize("margin,distance", [(0.4, "euclidean"), (0.4, "cosine"),
                                             (5.0, "manhattan"), (5.0, "euclidean")])
def test_triplet_margins_and_distances_match_on_the_same_vectors(models, vectors, margin,
                                                                distance):
    """Every distance, margins where some triplets are past it (no gradient from them): loss
    and gradient with respect to the sentence vectors, from MiniLM's vectors of the texts."""
    mine = [v.clone().requires_grad_() for v in vectors]
    theirs = [v.clone().requires_grad_() for v in vectors]
    objective = Triplet(margin, distance)
    objective.columns = lambda model, batch: mine
    got = objective.compute_loss(None, {"labels": torch.zeros(4)}).loss
    metric = getattr(_st_losses().TripletDistanceMetric, distance.upper())
    reference = _st_losses().TripletLoss(models[1], distance_metric=metric, triplet_margin=margin)
    expected = reference.compute_loss_from_embeddings(theirs, None)
    got.backward()
    expected.backward()
    assert_close_rounding(got, expected, terms=384, depth=3, scale=max(1.0, margin))
    for g, e in zip(mine, theirs):
        assert_close_rounding(g.grad, e.grad, terms=384, depth=3, scale=1.0)
    if margin < 1:  # some triplets are past the margin: their rows get no gradient
        assert any(float(g.grad[row].abs().max()) == 0 for g in mine for row in range(4))


@pytest.mark.numerics
def test_triplet_and_cosine_by_hand():
    anchor, positive, negative = (torch.tensor([[3.0, 4.0]]), torch.tensor([[0.0, 0.0]]),
                                  torch.tensor([[3.0, 0.0]]))
    batch = {"input_ids": None, "labels": torch.zeros(1)}
    objective = Triplet(margin=2.0)
    objective.columns = lambda model, batch: [anchor, positive, negative]
    # |a - p| = 5, |a - n| = 4: 5 - 4 + 2 = 3
    # tol: a hand-made triplet whose Euclidean distances are exact small integers
    assert float(objective.compute_loss(None, batch).loss) == pytest.approx(3.0)
    objective.margin = 0.0
    objective.columns = lambda model, batch: [anchor, negative, positive]  # 4 - 5 < 0: nothing
    assert float(objective.compute_loss(None, batch).loss) == 0.0
    regression = CosineRegression()
    regression.columns = lambda model, batch: [torch.tensor([[1.0, 0.0], [1.0, 1.0]]),
                                               torch.tensor([[0.0, 1.0], [2.0, 2.0]])]
    loss = regression.compute_loss(None, {"scores": torch.tensor([0.5, 0.5])}).loss
    # tol: cosines of hand-made vectors with exact values 0 and 1
    assert float(loss) == pytest.approx(((0 - 0.5) ** 2 + (1 - 0.5) ** 2) / 2)


def test_triplets_from_pairs_and_their_batches(minilm_dir):
    pairs = [SentencePair("a", "gloss a", 1), SentencePair("a", "other 1", 0),
             SentencePair("a", "gloss a again", 1), SentencePair("a", "other 2", 0),
             SentencePair("b", "gloss b", 1, negative="given"),
             SentencePair("c", "gloss c", 1)]  # no negative: left out
    rows = triplets_of(pairs)
    assert [(p.sentence1, p.sentence2, p.negative) for p in rows] == [
        ("a", "gloss a", "other 1"), ("a", "gloss a again", "other 2"), ("b", "gloss b", "given")]
    tokenizer = SentenceEncoder.load(minilm_dir).tokenizer
    stream = PairStream(pairs, tokenizer, 3, 16, triplets=True)
    batch = stream.make_batch([0, 1, 2])
    assert batch["input_ids"].shape[0] == 9 and batch["labels"].shape == (3,)
    third = tokenizer.decode(batch["input_ids"][6], skip_special_tokens=True)
    assert third == "other 1"
    scored = PairStream([SentencePair("x", "y", 1, score=0.25), SentencePair("x", "z", 0)],
                        tokenizer, 2, 16)
    assert scored.make_batch([0, 1])["scores"].tolist() == [0.25, 0.0]
    with pytest.raises(LmlabError, match="no triplet"):
        PairStream([SentencePair("c", "gloss c", 1)] * 2, tokenizer, 2, 16, triplets=True)


def _pair_file(path, with_scores=True):
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(8):
            row = {"sentence1": f"{ANCHORS[i % 4]} ({i})", "sentence2": POSITIVES[i % 4],
                   "label": 1, "negative": NEGATIVES[i % 4]}
            if with_scores:
                row["score"] = SCORES[i % 4]
            handle.write(json.dumps(row) + "\n")
    return path


@pytest.mark.parametrize("objective", ["cosine", "triplet"])
def test_cli_trains_cosine_and_triplet(tmp_path, objective):
    data = _pair_file(tmp_path / "pairs.jsonl")
    out = tmp_path / "run"
    result = run_lmlab_here("sentence", "train", "--objective", objective, "--data", data, "--size",
                       "tiny", "--steps", 2, "--batch-size", 4, "--lr", 1e-3, "--max-length", 16,
                       "--margin", 1.0, "--threads", 1, "--out", out)
    assert result.returncode == 0, result.stderr[-2000:]
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()
              if '"loss"' in line and "eval" not in line]
    assert len(losses) == 2 and all(loss > 0 for loss in losses)
    recorded = (out / "config.json").read_text()
    assert ('"margin": 1.0' in recorded) == (objective == "triplet")
    encoder = SentenceEncoder.load(out / "model")
    assert encoder.encode(["a test"]).shape[0] == 1


def test_bad_scores_margins_and_distances_are_refused_before_any_work(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"sentence1": "a", "sentence2": "b", "label": 1, "score": 4.2})
                    + "\n", encoding="utf-8")
    with pytest.raises(LmlabError, match=r"score 4.2 is not a number in \[-1, 1\]"):
        read_pairs(path)
    path.write_text("".join(json.dumps({"sentence1": f"a{i}", "sentence2": "b", "label": 2})
                            + "\n" for i in range(4)), encoding="utf-8")
    result = run_lmlab_here("sentence", "train", "--objective", "cosine", "--data", path,
                            "--steps", 1, "--out", tmp_path / "run")
    assert_clean_refusal(result, "has label 2 and no score", fix="give each pair a `score`")
    data = _pair_file(tmp_path / "ok.jsonl", with_scores=False)
    result = run_lmlab_here("sentence", "train", "--objective", "triplet", "--data", data,
                            "--margin", -1, "--steps", 1, "--out", tmp_path / "run")
    assert_clean_refusal(result, "margin -1.0 is negative", fix="use e.g. 5")
    assert not (tmp_path / "run").exists()
    with pytest.raises(LmlabError, match="unknown triplet distance"):
        Triplet(distance="dot")
