"""Word senses by layer (lmlab.analysis.senses, ``lmlab senses``): the classifiers and baselines
on hand-computed cases, the WordNet data, the GloVe reader, the per-layer target vectors against
transformers, and the command end to end and on bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import assert_close_rounding, run_lmlab

from lmlab.analysis import senses
from lmlab.analysis.senses import SenseExample
from lmlab.text.sources import wordnet
from lmlab.vectors.keyed import glove_6b_50d


def toy() -> tuple[list[SenseExample], torch.Tensor, list[int], list[int]]:
    """Lemma ``bank``: train A at 0 and 90 degrees (centroid at 45), train B at 5.7 degrees; a
    test A at -5.7 degrees is nearest to A's first example but to B's centroid. A test example in
    sense C (no train example) and one of a lemma with no train example at all."""
    def ex(lemma, sense, i):
        return SenseExample(lemma, "n", sense, f"{lemma} sentence {i}", (0, len(lemma)))

    examples = [ex("bank", "A", 0), ex("bank", "A", 1), ex("bank", "B", 2),
                ex("bank", "A", 3), ex("bank", "C", 4), ex("crane", "D", 5)]
    vectors = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.1],
                            [1.0, -0.1], [0.0, 1.0], [1.0, 1.0]])
    return examples, vectors, [0, 1, 2], [3, 4, 5]


def test_nearest_centroid_and_1nn_give_the_hand_computed_senses():
    examples, vectors, train, test = toy()
    # test 3: centroid A (0.5, 0.5) is 50.7 degrees away, B 11.4 -> B; its nearest example is
    # A's (1, 0), 5.7 degrees -> A. test 4 (0, 1): centroid A 45 vs B 84 -> A; 1-NN: A's (0, 1).
    assert senses.nearest_centroid(examples, vectors, train, test) == ["B", "A", None]
    assert senses.nearest_neighbour(examples, vectors, train, test) == ["A", "A", None]


def test_most_frequent_sense_picks_wordnets_first_sense_among_trained_senses():
    examples, _, train, test = toy()
    ranks = {("bank", "n", "C"): 1, ("bank", "n", "B"): 2, ("bank", "n", "A"): 3}
    # C ranks first but has no train example, so B is predicted
    assert senses.most_frequent_sense(examples, train, test, ranks) == ["B", "B", None]
    assert senses.most_frequent_sense(examples, train, test, {}) == ["A", "A", None]  # by id


def test_score_counts_unanswered_against_recall_only():
    gold = ["A", "C", "D"]
    result = senses.score(["A", "A", None], gold)  # 1 correct of 2 answered, of 3
    assert (result["precision"], result["recall"]) == (0.5, pytest.approx(1 / 3))
    assert result["f1"] == pytest.approx(2 * 0.5 * (1 / 3) / (0.5 + 1 / 3))
    assert senses.score([None, None, None], gold)["f1"] == 0.0


def test_split_holds_out_one_example_of_each_sense_seen_twice():
    examples, _, _, _ = toy()
    train, test = senses.split_examples(examples)
    assert sorted(train + test) == list(range(len(examples)))
    held = [examples[i].sense for i in test]
    assert held == ["A"]  # A has three examples; B, C, D one each (train-only distractors)
    assert senses.split_examples(examples) == (train, test)  # deterministic


def test_report_table_and_best_layer():
    def row(layer, f1):
        return {"layer": layer, "centroid": {"f1": f1}, "nearest": {"f1": f1 / 2}}

    report = senses.WsdReport("m", [row(0, 0.2), row(1, 0.5), row(2, 0.5)],
                              {"most frequent sense": {"f1": 0.4}},
                              {"lemmas": 1, "senses": 2, "train": 3, "test": 4})
    assert report.best_layer("centroid") == 1  # the lowest of the tied layers
    assert report.to_dict()["best_layer"] == {"centroid": 1, "nearest": 1}
    table = report.table()
    assert "0 (embeddings)" in table and "50.0" in table and "most frequent sense" in table


@pytest.fixture(scope="module")
def noun_examples():
    return senses.sense_examples(pos=("n",))


def test_sense_examples_find_the_lemma_in_its_own_synsets_examples(noun_examples):
    synsets = {s.id: s for s in wordnet.read_synsets()}
    exceptions = wordnet.read_exceptions()
    bank = [e for e in noun_examples if e.lemma == "bank"]
    assert len({e.sense for e in bank}) >= 2
    assert "n09213565" in {e.sense for e in bank}  # sloping land: "they pulled the canoe up on
    for example in bank + noun_examples[::500]:  # the bank"
        synset = synsets[example.sense]
        assert example.pos == "n" and example.sentence in synset.examples
        assert example.lemma in [lemma.lower() for lemma in synset.lemmas]
        found = example.sentence[example.span[0]:example.span[1]].lower()
        assert found in wordnet.surface_forms(example.lemma, "n", exceptions)
    by_lemma = {}
    for example in noun_examples:
        by_lemma.setdefault(example.key, set()).add(example.sense)
    assert min(len(s) for s in by_lemma.values()) >= 2  # only lemmas with two senses


def test_max_lemmas_picks_the_same_lemmas_every_time():
    a = senses.sense_examples(pos=("v",), max_lemmas=5)
    assert len({e.key for e in a}) == 5 and a == senses.sense_examples(pos=("v",), max_lemmas=5)


def test_sense_ranks_read_index_sense():
    ranks = senses.sense_ranks()
    assert ranks[("dog", "n", "n02084071")] == 1
    assert ranks[("bank", "n", "n09213565")] == 1 and ranks[("bank", "n", "n08420278")] == 2


@pytest.mark.numerics
def test_glove_context_vector():
    glove = glove_6b_50d()
    sentence = "The cat sat on the mat"
    expected = (glove.vector("the") + glove.vector("sat")) / 2  # "The" is read lower-cased
    words = np.stack([glove.vector("the"), glove.vector("sat")])  # a mean of 2: one sum
    assert_close_rounding(senses.context_vector(glove, sentence, (4, 7), window=1), expected,
                          terms=2, scale=float(np.abs(words).max()))
    assert not senses.context_vector(glove, "qqqzzzxq cat", (9, 12)).any()  # zeros


@pytest.mark.numerics
def test_target_vectors_equal_transformers_hidden_states(minilm_dir):
    """Every layer's pooled target, including two targets of one sentence encoded once."""
    from transformers import AutoModel, AutoTokenizer

    import lmlab

    model = lmlab.from_pretrained(minilm_dir)
    tok = lmlab.Tokenizer.from_pretrained(minilm_dir)
    examples = [SenseExample("unbreakable", "a", "a1", "An unbreakable vase broke.", (3, 14)),
                SenseExample("bank", "n", "n1", "the bank", (4, 8)),
                SenseExample("the", "n", "n2", "the bank", (0, 3))]  # one sentence, two targets
    vectors, kept = senses.target_vectors(model, tok, examples, batch_size=2)
    assert kept == [0, 1, 2] and vectors.shape == (3, 7, 384)
    hf_tok = AutoTokenizer.from_pretrained(minilm_dir)
    hf = AutoModel.from_pretrained(minilm_dir).eval()
    for row, example in enumerate(examples):
        batch = hf_tok(example.sentence, return_tensors="pt", return_offsets_mapping=True)
        offsets = batch.pop("offset_mapping")[0].tolist()
        pieces = [i for i, (s, e) in enumerate(offsets) if e > s and s < example.span[1]
                  and e > example.span[0]]
        assert len(pieces) == (3 if row == 0 else 1)  # un ##break ##able / bank
        with torch.no_grad():
            states = hf(**batch, output_hidden_states=True).hidden_states
        expected = torch.stack([h[0, pieces].mean(0) for h in states])  # (L+1, H)
        assert_close_rounding(vectors[row], expected, terms=384, depth=7)


def test_command_writes_table_json_and_plot(tmp_path, minilm_dir):
    out = tmp_path / "senses"
    result = run_lmlab("senses", minilm_dir, "--pos", "n,v", "--max-lemmas", "40",
                       "--out", out, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "0 (embeddings)" in result.stdout and "most frequent sense" in result.stdout
    report = json.loads((out / "senses.json").read_text())
    assert [row["layer"] for row in report["layers"]] == list(range(7))
    assert report["counts"]["lemmas"] == 40 and report["counts"]["test"] > 0
    assert set(report["baselines"]) == {"most frequent sense", "GloVe context (+-5 words)"}
    for row in report["layers"]:
        assert 0.0 <= row["centroid"]["f1"] <= 1.0
    assert report["best_layer"]["centroid"] in range(7)
    assert (out / "senses.png").read_bytes()[:4] == b"\x89PNG"
    again = run_lmlab("senses", minilm_dir, "--max-lemmas", "40", "--out", out)
    assert again.returncode == 2 and "already holds" in again.stderr


@pytest.mark.parametrize("args, message", [
    (["minilm", "--pos", "n,x"], "unknown part of speech 'x'"),
    (["minilm", "--max-lemmas", "0"], "--max-lemmas"),
    (["no-such-model-folder"], "does not exist"),
])
def test_command_refuses_bad_input_before_work(tmp_path, args, message):
    result = run_lmlab("senses", *args, "--out", tmp_path / "out", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "fix:" in result.stderr
    assert not (tmp_path / "out").exists()


def test_an_occurrence_listed_under_two_senses_is_dropped():
    """WordNet gives some example sentences under two senses of their lemma ("had ample food
    for the party"): such an occurrence has no single right answer and is left out."""
    examples = senses.sense_examples(pos=("a",))
    seen: dict[tuple, set] = {}
    for e in examples:
        seen.setdefault((e.lemma, e.pos, e.sentence, e.span), set()).add(e.sense)
    assert all(len(s) == 1 for s in seen.values())
    assert not [e for e in examples if e.lemma == "ample" and "ample food" in e.sentence]


def test_a_senses_held_out_example_does_not_depend_on_the_sample():
    """The test example of a sense is the same whether 40 lemmas or all of them are sampled."""
    few = senses.sense_examples(pos=("n",), max_lemmas=40)
    everything = senses.sense_examples(pos=("n",))
    lemmas = {e.lemma for e in few}
    held = {(few[i].sense, few[i].sentence) for i in senses.split_examples(few)[1]}
    _, test = senses.split_examples(everything)
    held_all = {(everything[i].sense, everything[i].sentence) for i in test
                if everything[i].lemma in lemmas}
    assert held and held == held_all
