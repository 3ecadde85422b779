"""Sentence encoders (lmlab.sentence, skip-thought, quick-thought): parity with
sentence-transformers on all-MiniLM-L6-v2, the losses checked by hand, WordNet pair building,
save/reload in a fresh process, and refusals of bad input."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from lmlab.models.pooling import masked_mean
from lmlab.objectives.quick_thought import QuickThought, neighbour_targets, quick_thought_loss
from lmlab.objectives.skip_thought import SkipThought
from lmlab.sentence.data import (
    ContiguousStream,
    PairStream,
    TripleStream,
    collate_columns,
    encode_texts,
)
from lmlab.sentence.encoder import SentenceEncoder
from lmlab.sentence.evaluate import best_threshold
from lmlab.sentence.objectives import MultipleNegativesRanking, PairClassification, mnrl_loss
from lmlab.sentence.pairs import SentencePair, read_pairs
from lmlab.utils.errors import LmlabError
from tests.conftest import (
    assert_clean_refusal,
    assert_close_rounding,
    disk_snapshot,
    run_lmlab,
    run_lmlab_here,
)

ANCHORS = ["A man is playing a guitar.", "The cat sleeps on the warm windowsill.",
           "Stock markets fell sharply today", "to move fast on foot"]
POSITIVES = ["Someone plays an instrument.", "A kitten naps in the sun.",
             "Shares dropped on the exchange after the announcement.", "run quickly"]
NEGATIVES = ["A woman is slicing onions.", "The dog barks at the mailman all morning.",
             "It rained in the mountains", "a large body of water"]


@pytest.fixture(scope="module")
def sentence_transformer(minilm_dir):
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(str(minilm_dir), device="cpu")
    model.eval()
    return model


@pytest.fixture(scope="module")
def minilm_encoder(minilm_dir):
    encoder = SentenceEncoder.load(minilm_dir)
    encoder.model.eval()
    return encoder


def _st_losses():
    try:
        from sentence_transformers import losses
    except ImportError:
        from sentence_transformers.sentence_transformer import losses
    return losses


def _batch(encoder, *columns, labels=None):
    ids = [encode_texts(encoder.tokenizer, column, encoder.max_length) for column in columns]
    rows = len(columns[0])
    return collate_columns(ids, labels if labels is not None else [0] * rows,
                           list(range(rows * len(columns))), encoder.tokenizer.pad_token_id)


# -- parity with sentence-transformers ----------------------------------------------------------
@pytest.mark.numerics
def test_encode_matches_sentence_transformers(minilm_encoder, sentence_transformer):
    long_text = " ".join(["the quick brown fox jumps over the lazy dog"] * 40)  # > 256 tokens
    texts = [*ANCHORS, long_text, "x"]
    ours = minilm_encoder.encode(texts, batch_size=3)
    theirs = torch.tensor(sentence_transformer.encode(texts))
    assert minilm_encoder.normalize and minilm_encoder.max_length == 256
    assert_close_rounding(ours.norm(dim=-1), torch.ones(len(texts)), terms=384)  # unit vectors
    assert_close_rounding(ours, theirs, terms=384, depth=6)


@pytest.mark.parametrize("scale", [20.0, 1.0])  # 1.0: a loss far from 0, every logit counts
def test_mnrl_loss_matches_sentence_transformers(minilm_encoder, sentence_transformer, scale):
    theirs_loss = _st_losses().MultipleNegativesRankingLoss(sentence_transformer, scale=scale)
    objective = MultipleNegativesRanking(scale=scale, normalize=True)
    features = [sentence_transformer.tokenize(c) for c in (ANCHORS, POSITIVES, NEGATIVES)]
    with torch.no_grad():
        for columns in ((ANCHORS, POSITIVES), (ANCHORS, POSITIVES, NEGATIVES)):
            expected = theirs_loss(features[:len(columns)], None)
            ours = objective.compute_loss(minilm_encoder.model, _batch(minilm_encoder, *columns))
            assert ours.num_predictions == len(ANCHORS)
            assert_close_rounding(ours.loss, expected, terms=384, depth=6, scale=scale)


@pytest.mark.numerics
def test_softmax_loss_matches_sentence_transformers(minilm_encoder, sentence_transformer):
    torch.manual_seed(0)
    theirs_loss = _st_losses().SoftmaxLoss(sentence_transformer, 384, 3)
    objective = PairClassification(384, num_labels=3, normalize=True)
    objective.classifier.load_state_dict(theirs_loss.classifier.state_dict())
    labels = [0, 1, 2, 1]
    features = [sentence_transformer.tokenize(c) for c in (ANCHORS, POSITIVES)]
    with torch.no_grad():
        expected = theirs_loss(features, torch.tensor(labels))
        ours = objective.compute_loss(minilm_encoder.model,
                                      _batch(minilm_encoder, ANCHORS, POSITIVES, labels=labels))
    assert_close_rounding(ours.loss, expected, terms=3 * 384, depth=6)


# -- the losses by hand ---------------------------------------------------------------------------
def _cos(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def _cross_entropy(logits, target):
    top = max(logits)
    return -(logits[target] - top - math.log(sum(math.exp(x - top) for x in logits)))


@pytest.mark.numerics
def test_mnrl_loss_by_hand_with_group_mask():
    anchors = [[1.0, 0.0], [0.6, 0.8], [0.0, -1.0]]
    candidates = [[0.9, 0.1], [0.5, 0.5], [0.2, -0.9], [-1.0, 0.3]]  # 3 positives + 1 negative
    scale = 5.0
    expected = sum(_cross_entropy([scale * _cos(a, c) for c in candidates], i)
                   for i, a in enumerate(anchors)) / 3
    loss, _ = mnrl_loss(torch.tensor(anchors), torch.tensor(candidates), scale)
    # float32 against float64: cosines of 2, a log-softmax over 4, the mean of 3; logits <= 5
    bound = {"terms": 4, "depth": 3, "scale": scale}
    assert_close_rounding(loss, expected, **bound)
    # candidates 0 and 1 are the same gloss (group 7): neither is a negative of the other's anchor
    groups = torch.tensor([7, 7, 8, 9])
    masked = []
    for i, a in enumerate(anchors):
        keep = [j for j in range(4) if j == i or groups[j] != groups[i]]
        logits = [scale * _cos(a, candidates[j]) for j in keep]
        masked.append(_cross_entropy(logits, keep.index(i)))
    loss, _ = mnrl_loss(torch.tensor(anchors), torch.tensor(candidates), scale, groups)
    assert_close_rounding(loss, sum(masked) / 3, **bound)


@pytest.mark.numerics
def test_pair_classification_by_hand():
    objective = PairClassification(2, num_labels=2)
    weight = torch.tensor([[0.1, -0.2, 0.3, 0.4, -0.5, 0.6], [0.0, 0.5, -0.1, 0.2, 0.3, -0.4]])
    with torch.no_grad():
        objective.classifier.weight.copy_(weight)
        objective.classifier.bias.copy_(torch.tensor([0.05, -0.05]))
    u, v = [1.0, 2.0], [3.0, -1.0]
    features = u + v + [abs(a - b) for a, b in zip(u, v)]
    logits = [sum(w * x for w, x in zip(row, features)) + b
              for row, b in zip(weight.tolist(), [0.05, -0.05])]
    got = objective.logits(torch.tensor([u]), torch.tensor([v]))[0]
    assert_close_rounding(got, logits, terms=6, scale=3.0)  # a product of 6 inputs (<= 3)


def test_masked_mean_ignores_padding():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    assert masked_mean(hidden, torch.tensor([[1, 1, 0]])).tolist() == [[2.0, 3.0]]


@pytest.mark.numerics
def test_quick_thought_loss_by_hand():
    f = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.5, -0.5]]
    g = [[0.5, 0.2], [0.1, 0.9], [-0.3, 0.4], [1.0, 1.0]]
    document = torch.tensor([0, 0, 0, 1])  # the fourth sentence starts another document
    targets = neighbour_targets(document)
    assert targets.nonzero().tolist() == [[0, 1], [1, 0], [1, 2], [2, 1]]
    terms = []
    for i, j in [(0, 1), (1, 0), (1, 2), (2, 1)]:
        others = [k for k in range(4) if k != i]
        scores = [sum(a * b for a, b in zip(f[i], g[k])) for k in others]
        terms.append(_cross_entropy(scores, others.index(j)))
    loss, count = quick_thought_loss(torch.tensor(f), torch.tensor(g), targets)
    assert count == 4
    # float32 against float64: dot products of 2, a log-softmax over 3, the mean of 4 (<= 2)
    assert_close_rounding(loss, sum(terms) / 4, terms=3, depth=3, scale=2.0)


@pytest.mark.numerics
def test_skip_thought_decoder_loss_equals_unpadded_reference():
    torch.manual_seed(0)
    objective = SkipThought(vocab_size=20, context_dim=6, embedding_dim=5, decoder_hidden=7)
    ids = torch.tensor([[1, 4, 5, 6, 2], [1, 7, 2, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    context = torch.randn(2, 6)
    total, count = objective.decoder_loss(objective.following, ids, mask, context)
    reference = 0.0
    with torch.no_grad():
        for row in range(2):  # one sentence at a time, no padding, the log-softmax written out
            length = int(mask[row].sum())
            seq = ids[row, :length]
            outputs = objective.following(objective.embedding(seq[None, :-1]), context[row:row + 1])
            logits = outputs[0] @ objective.embedding.weight.T  # (length-1, V)
            reference += float(-(logits.log_softmax(-1)[torch.arange(length - 1), seq[1:]]).sum())
    assert count == 4 + 2
    # padded and not: 4 recurrent steps (width 7), the output product, a log-softmax over 20
    # words; 6 targets of about ln 20 summed
    assert_close_rounding(total, reference, terms=20, depth=6, scale=reference / count)
    other, _ = objective.decoder_loss(objective.following, ids, mask, context.flip(0))
    assert other.item() != pytest.approx(total.item(), rel=1e-3)  # conditioned on the vector


def test_best_threshold():
    threshold, accuracy = best_threshold([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1])
    assert accuracy == 0.75 and 0.1 < threshold <= 0.8
    assert best_threshold([0.2, 0.9], [0, 1]) == (pytest.approx(0.55), 1.0)
    # tied scores get one prediction: the accuracy is the one the threshold gives
    scores, labels = [0.5, 0.5, 0.9], [0, 1, 1]
    threshold, accuracy = best_threshold(scores, labels)
    applied = sum((s >= threshold) == bool(y) for s, y in zip(scores, labels)) / len(labels)
    assert accuracy == applied == pytest.approx(2 / 3)


# -- pairs ------------------------------------------------------------------------------------------
def test_wordnet_pairs_keep_held_out_synsets_out_of_training():
    from lmlab.sentence.pairs import build_wordnet_pairs
    from lmlab.tasks.builtin import load_full_task

    pairs, info = build_wordnet_pairs()
    groups = {split: {p.group for p in rows} for split, rows in pairs.items()}
    assert not groups["train"] & groups["dev"] and not groups["train"] & groups["test"]
    assert not groups["dev"] & groups["test"]
    for split, rows in pairs.items():
        assert len(rows) == 2 * info["pairs"][split] // 2 and len(rows) > 1000
        positives = rows[0::2]
        negatives = rows[1::2]
        assert {p.label for p in positives} == {1} and {p.label for p in negatives} == {0}
        assert all(p.sentence1 == n.sentence1 and p.group != n.group
                   for p, n in zip(positives, negatives))
    wic = load_full_task("wordnet-wic")
    held = {t for s in ("dev", "test") for e in wic.split(s) for t in (e.text, e.text_pair)}
    assert not held & {p.sentence1 for p in pairs["train"]}
    assert info["train_examples_dropped_as_wic_eval_text"] > 0


def test_pair_stream_batches_are_columns_and_never_single(minilm_encoder):
    pairs = [SentencePair(a, p, 1, f"g{i % 2}") for i, (a, p) in
             enumerate(zip(ANCHORS + ANCHORS[:1], POSITIVES + POSITIVES[:1]))]
    stream = PairStream(pairs, minilm_encoder.tokenizer, 2, 32, positives_only=True)
    batches = stream.epoch_batches(0)
    assert all(len(b) == 2 for b in batches) and len(batches) == 2  # the fifth pair waits
    batch = stream.make_batch(batches[0])
    assert batch["input_ids"].shape[0] == 4 and batch["labels"].shape == (2,)
    first = pairs[batches[0][0]]
    assert minilm_encoder.tokenizer.decode(batch["input_ids"][2], skip_special_tokens=True) \
        == minilm_encoder.tokenizer.decode(
            minilm_encoder.tokenizer.encode(first.sentence2), skip_special_tokens=True)


def _next(stream, count):
    batches = iter(stream)
    return [next(batches) for _ in range(count)]


@pytest.mark.parametrize("kind", ["pairs", "triples", "contiguous"])
def test_sentence_streams_resume_exactly_across_epochs(minilm_encoder, kind):
    """A stream rebuilt from its settings and ``state_dict`` continues with the very batches
    the first one gives next (the Trainer's resume), past an epoch's end."""
    tok = minilm_encoder.tokenizer
    documents = [[f"Sentence {d}.{i} about the river." for i in range(2 + d % 4)]
                 for d in range(9)]
    pairs = [SentencePair(f"first {i}", f"second {i % 5}", 1, f"g{i % 5}") for i in range(13)]
    make = {"pairs": lambda: PairStream(pairs, tok, 3, 12, seed=5, positives_only=True),
            "triples": lambda: TripleStream(documents, tok, 3, 12, seed=5),
            "contiguous": lambda: ContiguousStream(documents, tok, 4, 12, seed=5)}[kind]
    first = make()
    per_epoch = len(first.epoch_batches(0))
    _next(first, per_epoch + 1)  # into the second epoch
    state = first.state_dict()
    assert state == {"epoch": 1, "position": 1, "seed": 5}
    expected = _next(first, per_epoch)  # the rest of epoch 1 and into epoch 2
    resumed = make()
    resumed.load_state_dict(state)
    got = _next(resumed, per_epoch)
    assert all(a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # exact: copies
               for a, b in zip(got, expected))
    assert resumed.state_dict() == first.state_dict()
    fresh = _next(make(), per_epoch)  # without the state: other batches (the test can fail)
    assert any(not torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(fresh, expected))


# -- training, save and reload ---------------------------------------------------------------------
def _write_pairs(path, count=12):
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(count):
            handle.write(json.dumps({"sentence1": f"{ANCHORS[i % 4]} ({i})",
                                     "sentence2": POSITIVES[i % 4], "label": 1,
                                     "group": f"s{i % 4}"}) + "\n")
    return path


def _tiny_cfg(steps, batch_size=4, lr=1e-3):
    from lmlab.training.config import TrainingConfig

    return TrainingConfig(lr=lr, batch_size=batch_size, max_steps=steps, progress=False,
                          log_every=1, warmup_fraction=0.0)


def test_trained_encoder_reloads_in_a_fresh_process(tmp_path, sentence_transformer):
    from lmlab.sentence.train import train_sentence_encoder

    data = _write_pairs(tmp_path / "pairs.jsonl")
    out = tmp_path / "run"
    result = train_sentence_encoder("mnrl", data, out, _tiny_cfg(2), size="tiny", max_length=32)
    assert result.step == 2
    texts = ["a sentence to encode", "another one, longer than the first"]
    expected = SentenceEncoder.load(out / "model").encode(texts)
    script = (
        "import json, sys, torch\n"
        "from lmlab.sentence import SentenceEncoder\n"
        f"texts = {texts!r}\n"
        "ours = SentenceEncoder.load(sys.argv[1]).encode(texts)\n"
        "print(json.dumps(ours.tolist()))\n")
    done = subprocess.run([sys.executable, "-c", script, str(out / "model")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert torch.equal(torch.tensor(json.loads(done.stdout.strip().splitlines()[-1])), expected)  # exact: the same texts, batch and weights
    # the saved folder is a sentence-transformers model: mean pooling, the same vectors
    theirs = type(sentence_transformer)(str(out / "model"), device="cpu").encode(texts)
    assert_close_rounding(torch.tensor(theirs), expected, terms=128, depth=2)


def _tiny_corpus(folder, documents=3, sentences=6):
    folder.mkdir()
    words = ["light", "water", "stone", "river", "night", "bread", "king", "field"]
    with open(folder / "train.jsonl", "w", encoding="utf-8") as handle:
        for d in range(documents):
            text = [f"The {words[(d + i) % 8]} came before the {words[(d + i + 3) % 8]}."
                    for i in range(sentences)]
            handle.write(json.dumps({"id": f"d{d}", "source": "test", "sentences": text}) + "\n")
    (folder / "validation.jsonl").write_text("", encoding="utf-8")
    return folder


@pytest.mark.parametrize("objective", ["skip-thought", "quick-thought"])
def test_sentence_order_objectives_train(tmp_path, objective):
    from lmlab.sentence.train import train_sentence_encoder

    corpus = _tiny_corpus(tmp_path / "corpus")
    out = tmp_path / "run"
    train_sentence_encoder(objective, corpus, out, _tiny_cfg(12, batch_size=6, lr=2e-3),
                           size="tiny", max_length=16, decoder_hidden=32, embedding_dim=16)
    losses = [r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text()
                                     .splitlines()) if r.get("kind") == "train"]
    assert len(losses) == 12 and all(math.isfinite(x) for x in losses)
    assert sum(losses[-3:]) < sum(losses[:3])  # it learns the tiny corpus
    assert SentenceEncoder.load(out / "model").encode(["The light came."]).shape == (1, 128)
    assert (out / "context_model").is_dir() == (objective == "quick-thought")
    if objective == "quick-thought":  # the paper's representation [f(s); g(s)]
        from lmlab.sentence import ConcatenatedEncoder

        both = ConcatenatedEncoder.load([out, out / "context_model"])
        assert both.encode(["The light came."]).shape == (1, 256)


# -- bad input ------------------------------------------------------------------------------------
def test_in_batch_negatives_refuse_a_batch_of_one(minilm_encoder):
    batch = _batch(minilm_encoder, ANCHORS[:1], POSITIVES[:1])
    with pytest.raises(LmlabError, match="at least two pairs"):
        MultipleNegativesRanking().compute_loss(minilm_encoder.model, batch)
    with pytest.raises(LmlabError, match="at least two"):
        PairStream([SentencePair("a", "b", 1)], minilm_encoder.tokenizer, 8, 16)
    with pytest.raises(LmlabError, match="batch size 1"):
        PairStream([SentencePair("a", "b", 1)] * 3, minilm_encoder.tokenizer, 1, 16)


def test_sentence_order_streams_refuse_too_few_sentences(minilm_encoder):
    with pytest.raises(LmlabError, match="previous and a next") as error:
        TripleStream([["One.", "Two."], ["Alone."]], minilm_encoder.tokenizer, 4, 16)
    assert "three or more sentences" in error.value.fix
    with pytest.raises(LmlabError, match="no sentence has a neighbour"):
        ContiguousStream([["One."], ["Two."], ["Three."]], minilm_encoder.tokenizer, 3, 16)
    with pytest.raises(LmlabError, match="fewer than one batch"):
        ContiguousStream([["One.", "Two."]], minilm_encoder.tokenizer, 8, 16)
    with pytest.raises(LmlabError, match="no context encoder"):
        QuickThought().compute_loss(minilm_encoder.model, {"document": torch.zeros(2)})


def test_pair_file_with_a_missing_field_is_refused(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"sentence1": "a", "sentence2": "b", "label": 1}) + "\n"
                    + json.dumps({"sentence1": "c", "label": 0}) + "\n", encoding="utf-8")
    with pytest.raises(LmlabError, match=r"pairs.jsonl:2 has no sentence2"):
        read_pairs(path)
    path.write_text(json.dumps({"sentence1": "a", "sentence2": "b", "label": "yes"}) + "\n",
                    encoding="utf-8")
    with pytest.raises(LmlabError, match="not a class number"):
        read_pairs(path)


def test_cli_refuses_bad_pairs_before_any_work(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"sentence2": "b", "label": 1}) + "\n", encoding="utf-8")
    result = run_lmlab_here("sentence", "train", "--objective", "mnrl", "--data", path, "--steps", 1,
                       "--out", tmp_path / "run")
    assert_clean_refusal(result, "pairs.jsonl:1 has no sentence1", fix="sentence1, sentence2")
    assert not (tmp_path / "run").exists()


def test_cli_refuses_an_unknown_or_absent_device_before_any_work(tmp_path):
    """``--device``: a name torch does not know is refused, and so is ``cuda`` on a machine
    without a GPU, before anything is written; with ``--overwrite`` the run already there is
    left as it was (the device is checked before the old run is removed)."""
    corpus = _tiny_corpus(tmp_path / "corpus", documents=4, sentences=4)
    train = ("sentence", "train", "--objective", "quick-thought", "--data", corpus, "--size",
             "tiny", "--steps", 1, "--batch-size", 4, "--threads", 1)
    devices = [("tpu", "unknown device 'tpu'", "cpu"), ("cuda:x", "unknown device", "cpu")]
    if not torch.cuda.is_available():
        devices.append(("cuda", "CUDA is not available", "--device cpu"))
    for device, problem, fix in devices:
        result = run_lmlab_here(*train, "--device", device, "--out", tmp_path / "new")
        assert_clean_refusal(result, problem, fix=fix)
        assert not (tmp_path / "new").exists()
    assert run_lmlab(*train, "--device", "cpu", "--out", tmp_path / "run").returncode == 0
    before = disk_snapshot(tmp_path / "run")
    for device, problem, fix in devices:
        result = run_lmlab_here(*train, "--device", device, "--overwrite", "--out", tmp_path / "run")
        assert_clean_refusal(result, problem, fix=fix)
        assert disk_snapshot(tmp_path / "run") == before


def test_cli_refuses_a_corpus_without_neighbours_and_a_missing_lee_folder(tmp_path):
    corpus = _tiny_corpus(tmp_path / "corpus", documents=4, sentences=2)
    result = run_lmlab_here("sentence", "train", "--objective", "skip-thought", "--data", corpus,
                       "--steps", 1, "--out", tmp_path / "run")
    assert_clean_refusal(result, "no sentence with a previous and a next sentence",
                         fix="three or more sentences")
    assert not (tmp_path / "run").exists()
    (tmp_path / "lee").mkdir()
    result = run_lmlab_here("sentence", "evaluate", "minilm", "--tasks", "lee", "--lee-dir",
                       tmp_path / "lee")
    assert_clean_refusal(result, "has no lee.cor, similarities0-1.txt", fix="--lee-dir")
