"""Clark et al.'s relation heads (lmlab/analysis/relation_heads.py) and ``lmlab relation-heads``.

The scoring is checked on hand-made attention arrays against the definition in the paper's code
(clarkkev/attention-analysis: word maps summed over the attended word's pieces and averaged over
the attending word's, the most-attended other word, both directions, the poss rule, offsets
-3..2 clamped); the batched word maps of MiniLM against transformers' eager attention merged
here with plain loops.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import assert_clean_refusal, run_lmlab, run_lmlab_here

from lmlab.analysis import relation_heads as R
from lmlab.load import load_model_and_tokenizer

transformers = pytest.importorskip("transformers")

# "The dog chased cats": The -det-> dog, dog -nsubj-> chased (root), cats -dobj-> chased
SENTENCE = R.ParsedSentence(["The", "dog", "chased", "cats"], [2, 3, 0, 3],
                            ["det", "nsubj", "root", "dobj"])


def test_word_maps_sum_over_the_attended_pieces_and_average_over_the_attending_ones():
    # tokens: [CLS] the dog chas ##ed cats [SEP]; "chased" is two pieces
    word_ids = [None, 0, 1, 2, 2, 3, None]
    generator = torch.Generator().manual_seed(0)
    maps = torch.rand(2, 3, 7, 7, generator=generator).softmax(-1)  # (L, H, T, T)
    got = R.sentence_word_maps(maps, word_ids)
    assert got.shape == (2, 3, 4, 4)
    pieces = [[1], [2], [3, 4], [5]]
    for w_from, rows in enumerate(pieces):
        for w_to, cols in enumerate(pieces):
            by_hand = sum(maps[..., r, c] for r in rows for c in cols) / len(rows)
            # tol: word-level maps by hand (sums and means of a few float32 attention weights <= 1)
            assert torch.allclose(got[..., w_from, w_to], by_hand, atol=1e-6)
    # one hand value: from "chased" to "cats" = mean of the two pieces' rows at column 5
    # tol: the mean of two float32 attention weights <= 1
    assert got[0, 0, 2, 3].item() == pytest.approx((maps[0, 0, 3, 5] + maps[0, 0, 4, 5]).item() / 2)


def test_a_sentence_whose_word_lost_its_tokens_is_refused():
    with pytest.raises(Exception, match="a word has no token"):
        R.sentence_word_maps(torch.eye(4)[None, None], [None, 0, 2, None])


def test_predictions_take_the_most_attended_other_word_in_both_directions():
    maps = np.zeros((1, 2, 4, 4))
    # head 0: each word attends most to itself (ignored) and next to its gold head
    maps[0, 0] = [[0.9, 0.1, 0.0, 0.0],   # The -> dog
                  [0.0, 0.6, 0.3, 0.1],   # dog -> chased
                  [0.4, 0.0, 0.5, 0.1],   # chased -> The (gold: root, never right)
                  [0.0, 0.0, 0.4, 0.6]]   # cats -> chased
    # head 1: the heads attend to their dependents (right only when transposed)
    maps[0, 1] = [[0.0, 0.0, 1.0, 0.0],
                  [1.0, 0.0, 0.0, 0.0],
                  [0.0, 0.5, 0.0, 0.5],   # a tie: the first word wins, as numpy's argmax
                  [0.0, 0.0, 0.0, 1.0]]   # only itself: every other word 0, the first wins
    predicted = R.attention_predictions(maps)  # (2, L, H, W), 1-based
    assert predicted[0, 0, 0].tolist() == [2, 3, 1, 3]
    assert predicted[0, 0, 1].tolist() == [3, 1, 2, 1]
    # transposed: word i's prediction is the word that attends to it most
    assert predicted[1, 0, 1].tolist() == [2, 3, 1, 3]
    result = R.RelationHeads(model="hand")
    result.add(SENTENCE, maps)
    assert result.counts == {"all": 4, "det": 1, "nsubj": 1, "root": 1, "dobj": 1}
    assert result.hits["det"].tolist() == [[[1, 0]], [[0, 1]]]
    assert result.hits["dobj"].tolist() == [[[1, 0]], [[0, 1]]]
    assert result.hits["all"].tolist() == [[[3, 0]], [[0, 3]]]
    assert result.best_head("nsubj") == (1.0, 0, 0, "dependent->head")


def test_offset_baseline_is_clamped_as_the_papers_code():
    assert R.offset_predictions(4, -3).tolist() == [0, 0, 0, 1]
    assert R.offset_predictions(4, -1).tolist() == [0, 1, 2, 3]
    assert R.offset_predictions(4, 1).tolist() == [2, 3, 4, 4]
    assert R.offset_predictions(4, 2).tolist() == [3, 4, 4, 4]
    result = R.RelationHeads()
    result.add(SENTENCE, np.full((1, 1, 4, 4), 0.25))
    # det and nsubj: the next word; dobj: the previous word; root: offset -3 lands on 0
    assert result.best_offset("det") == (1.0, 1)
    assert result.best_offset("dobj") == (1.0, -1)
    assert result.baseline["root"] == {-3: 1, -2: 0, -1: 0, 0: 0, 1: 0, 2: 0}
    assert result.baseline["all"][1] == 2 and result.best_offset("all") == (0.5, 1)
    rows = result.rows(min_count=1)
    assert [r["relation"] for r in rows] == ["all", "det", "dobj", "nsubj"]  # no root


def test_a_possessor_followed_by_s_is_scored_by_the_s_tokens_prediction():
    # "John 's dog barked": John -poss-> dog, 's -case-> John, dog -nsubj-> barked
    sentence = R.ParsedSentence(["John", "'s", "dog", "barked"], [3, 1, 4, 0],
                                ["poss", "case", "nsubj", "root"])
    predictions = np.array([[2, 3, 4, 1],    # John -> 's (wrong), but 's -> dog: counted right
                            [3, 1, 4, 3]])   # John -> dog, but 's -> John: counted wrong
    assert R.correct(predictions, sentence).tolist() == [[True, False, True, False],
                                                         [False, True, True, False]]
    plain = R.ParsedSentence(["John", "dog"], [2, 0], ["poss", "root"])
    assert R.correct(np.array([2, 1]), plain).tolist() == [True, False]


def test_markdown_json_and_plot(tmp_path):
    result = R.RelationHeads(model="hand", sample="one sentence")
    result.add(SENTENCE, np.full((2, 3, 4, 4), 0.25))
    paths = R.write_relation_heads(result, tmp_path, min_count=1)
    saved = json.loads(paths[0].read_text())
    assert saved["table"][1] == {"relation": "det", "count": 1, "layer": 0, "head": 0,
                                 "direction": "dependent->head", "accuracy": 1.0,
                                 "baseline_offset": 1, "baseline": 1.0}
    assert "| det | 1 | 0-0 | dependent->head | 100.0 | +1 | 100.0 |" in paths[1].read_text()
    assert paths[2].stat().st_size > 1000


@pytest.fixture(scope="module")
def minilm(minilm_dir):
    return load_model_and_tokenizer(minilm_dir)


def test_minilm_word_maps_of_a_padded_batch_match_transformers(minilm, minilm_dir):
    """Batched, right-padded word maps = transformers' eager maps of each sentence alone,
    merged here by loops over its fast tokenizer's word ids."""
    model, tokenizer = minilm
    hf = transformers.AutoModel.from_pretrained(minilm_dir, attn_implementation="eager").eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    sentences = [R.ParsedSentence(w, [0] * len(w), ["root"] * len(w)) for w in (
        ["Tokenizers", "split", "unbelievable", "embeddings", "."], ["He", "ran"],
        ["the", "boy", "'s", "dog", "didn't", "bark"])]
    got = dict(R.word_attention_maps(model, tokenizer, sentences, batch_size=3))
    assert sorted(got) == [0, 1, 2]
    for index, sentence in enumerate(sentences):
        batch = hf_tok(sentence.words, is_split_into_words=True, return_tensors="pt")
        with torch.no_grad():
            maps = torch.stack(hf(**batch, output_attentions=True).attentions)[:, 0]  # (L,H,T,T)
        word_ids = batch.word_ids(0)
        n = len(sentence.words)
        expected = torch.zeros(maps.shape[0], maps.shape[1], n, n)
        for q, wq in enumerate(word_ids):
            for k, wk in enumerate(word_ids):
                if wq is not None and wk is not None:
                    expected[..., wq, wk] += maps[..., q, k] / word_ids.count(wq)
        # tol: lmlab's batched attention against transformers' eager attention on MiniLM, float32 probabilities <= 1 after 6 layers
        assert np.abs(got[index] - expected.numpy()).max() < 1e-5


def test_cli_writes_what_the_api_computes(tmp_path, minilm):
    text_file = tmp_path / "texts.txt"
    text_file.write_text("the dog chased the cats\nshe read her brother's letter\n\n"
                         "a tall man ate an apple\n")
    out = tmp_path / "rh"
    result = run_lmlab("relation-heads", "minilm", "--text-file", text_file, "--min-count", "1",
                       "--out", out)
    assert result.returncode == 0, result.stderr
    assert "silver" in result.stdout and "| det |" in result.stdout
    saved = json.loads((out / "relation_heads.json").read_text())
    parsed = R.parse_sentences(text_file.read_text().split("\n"))
    assert len(parsed) == 3 and saved["sentences"] == 3
    model, tokenizer = minilm
    expected = R.relation_heads(model, tokenizer, parsed).rows(min_count=1)
    for row, want in zip(saved["table"], expected, strict=True):
        assert row["relation"] == want["relation"] and row["count"] == want["count"]
        assert row["accuracy"] == pytest.approx(want["accuracy"])
        assert row["baseline"] == pytest.approx(want["baseline"])
    assert (out / "relation_heads.png").stat().st_size > 1000


def test_cli_refusals_come_before_any_work(tmp_path):
    assert_clean_refusal(run_lmlab_here("relation-heads", "minilm", "--sample", "0", "--out",
                                        tmp_path / "a"), "--sample must be at least 1")
    assert_clean_refusal(run_lmlab_here("relation-heads", "minilm", "--min-count", "0", "--out",
                                        tmp_path / "a"), "--min-count must be at least 1")
    assert_clean_refusal(run_lmlab_here("relation-heads", "minilm", "--text-file",
                                        tmp_path / "no.txt", "--out", tmp_path / "a"),
                         "does not exist")
    assert not (tmp_path / "a").exists()
    with pytest.raises(Exception, match="no parsed sentence"):
        R.relation_heads(None, None, [])
