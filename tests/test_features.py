"""Contextual representations, fill-mask and feature-extraction pipelines, neighbours."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_close_rounding

import lmlab
from lmlab.analysis.features import FeatureExtractor
from lmlab.analysis.neighbours import ContextualIndex, StaticWordVectors, find_occurrences
from lmlab.models.pooling import STRATEGIES, combine_layers
from lmlab.utils.errors import LmlabError

SENTENCES = ["The vase broke.", "Dawn broke over the hills.", "A crane caught a fish.",
             "A crane picked up the steel beam.", "Snuffleupagus?"]


@pytest.fixture(scope="module")
def minilm(minilm_dir):
    return lmlab.from_pretrained(minilm_dir), lmlab.Tokenizer.from_pretrained(minilm_dir)


@pytest.mark.numerics
def test_strategies_shapes(minilm):
    model, tok = minilm
    batch = tok(SENTENCES[:2], padding=True, return_tensors="pt")
    with torch.no_grad():
        hs = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   output_hidden_states=True).hidden_states
    assert len(hs) == 7
    assert torch.equal(combine_layers(hs, "last"), hs[-1])  # exact: the layer itself
    assert torch.equal(combine_layers(hs, 0), hs[0])  # exact: the layer itself
    # Same sums in other orders (a reduction over a stack, chained adds): rounding of 4 and of
    # 7 terms of the layers' size; a missing or extra layer differs by a whole hidden state.
    size = float(torch.stack(hs).abs().max())
    assert_close_rounding(combine_layers(hs, "sum_last_four"), hs[-1] + hs[-2] + hs[-3] + hs[-4],
                          terms=4, scale=4 * size)
    assert combine_layers(hs, "concat_last_four").shape[-1] == 4 * 384
    assert_close_rounding(combine_layers(hs, "weighted_sum_all"), torch.stack(hs).mean(0),
                          terms=7, scale=size)
    assert set(STRATEGIES) >= {"embeddings", "second_to_last"}
    with pytest.raises(LmlabError, match="layer 9"):
        combine_layers(hs, 9)


def test_summing_strategies_refuse_layers_of_different_widths():
    """An AWD-LSTM's hidden states are E, H, H, E wide: summing them is refused with the fix
    (torch would only say that stack expects equal sizes); concatenating and single layers
    still work."""
    hs = [torch.zeros(1, 3, 4), torch.zeros(1, 3, 8), torch.zeros(1, 3, 8), torch.zeros(1, 3, 4)]
    for strategy in ("sum_last_four", "weighted_sum_all"):
        with pytest.raises(LmlabError, match="different widths .4, 8."):
            combine_layers(hs, strategy)
    assert combine_layers(hs, "concat_last_four").shape[-1] == 24
    assert combine_layers(hs, 2).shape[-1] == 8


def test_sentence_vectors_equal_sentence_transformers(minilm, minilm_dir):
    from sentence_transformers import SentenceTransformer

    model, tok = minilm
    ours = lmlab.pipeline("feature-extraction", model=model, tokenizer=tok)(
        SENTENCES, pooling="mean", normalize=True)
    reference = SentenceTransformer(str(minilm_dir), device="cpu").encode(
        SENTENCES, convert_to_tensor=True, normalize_embeddings=True)
    # Unit vectors after 6 layers (widest sum: 1536 terms), computed by other kernels.
    assert_close_rounding(ours, reference.cpu(), terms=1536, depth=6, scale=1.0)


def test_word_vectors_pool_pieces(minilm):
    model, tok = minilm
    encoded = FeatureExtractor(model, tok).encode(["Snuffleupagus?"])[0]
    pieces = [t for t, w in zip(encoded.tokens, encoded.word_ids) if w == 0]
    assert len(pieces) > 1, "the test needs a word split into several pieces"
    words, first = encoded.word_vectors("first")
    _, mean = encoded.word_vectors("mean")
    _, last = encoded.word_vectors("last")
    assert words == ["Snuffleupagus", "?"]
    positions = [i for i, w in enumerate(encoded.word_ids) if w == 0]
    # The same rows and the same mean, op for op: exactly equal.
    assert torch.equal(first[0], encoded.vectors[positions[0]])  # exact: the same rows and mean, op for op
    assert torch.equal(last[0], encoded.vectors[positions[-1]])  # exact: the same rows and mean, op for op
    assert torch.equal(mean[0], encoded.vectors[positions].mean(0))  # exact: the same rows and mean, op for op


def test_contextual_neighbours_separate_senses(minilm):
    model, tok = minilm
    corpus = ["The glass broke into pieces on the floor.", "The cup fell and broke.",
              "Day broke and the sun rose.", "Morning broke over the quiet sea.",
              "He broke the plate.", "Nothing happened here."]
    index = ContextualIndex.build(model, tok, corpus, "broke", layer="last")
    assert len(index.sentences) == 5
    vase = [h.sentence for h in index.query("The vase broke.", k=2)]
    dawn = [h.sentence for h in index.query("Dawn broke.", k=2)]
    assert vase != dawn
    assert any("Day" in s or "Morning" in s for s in dawn)
    static = StaticWordVectors(model, tok)
    assert torch.equal(static.vector("broke"), static.vector("broke"))  # exact: the same call twice
    assert len(static.nearest_words("broke", k=3)) == 3
    with pytest.raises(LmlabError, match="does not contain"):
        index.query("Nothing here.")


def test_find_occurrences_whole_words():
    found = find_occurrences(["He broke it.", "unbroken", "Broke!", "broken"], "broke", 10)
    assert found == ["He broke it.", "Broke!"]


@pytest.mark.numerics
def test_fill_mask_matches_transformers_pipeline(tmp_path, minilm_dir):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64)
    torch.manual_seed(0)
    reference = transformers.BertForMaskedLM(config).eval()
    reference.save_pretrained(tmp_path)
    ref_tok = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    ref_tok.save_pretrained(tmp_path)
    text = "Paris is the [MASK] of France."
    ours = lmlab.pipeline("fill-mask", model=tmp_path)(text, top_k=5)
    theirs = transformers.pipeline("fill-mask", model=reference, tokenizer=ref_tok)(text, top_k=5)
    assert [g["token"] for g in ours] == [g["token"] for g in theirs]
    for a, b in zip(ours, theirs):  # probabilities (<= 1) after a softmax over 30522 words
        assert_close_rounding(a["score"], b["score"], terms=30522, depth=2)
    two = lmlab.pipeline("fill-mask", model=tmp_path)("[MASK] is the [MASK] of France.", top_k=2)
    assert len(two) == 2 and len(two[0]) == 2


def test_fill_mask_refuses_model_without_mlm_head(minilm_dir):
    with pytest.raises(LmlabError, match="no trained 'mlm' head"):
        lmlab.pipeline("fill-mask", model=minilm_dir)


def test_unknown_pipeline():
    with pytest.raises(LmlabError, match="unknown pipeline"):
        lmlab.pipeline("summarise-everything", model=".")


def test_cli_embed_and_neighbours(minilm_dir, tmp_path, capsys):
    from lmlab.cli import main

    assert main(["embed", str(minilm_dir), "The vase broke.", "--pooling", "mean"]) == 0
    assert "shape (384,)" in capsys.readouterr().out
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    from lmlab.text.corpus import Document

    docs = [Document(f"d{i}", "test", [s]) for i, s in enumerate(
        ["The glass broke.", "Day broke early.", "He broke the law."])]
    (corpus / "train.jsonl").write_text("\n".join(d.to_json() for d in docs) + "\n")
    assert main(["neighbours", str(minilm_dir), "--corpus", str(corpus), "--word", "broke",
                 "The vase broke.", "--k", "2"]) == 0
    out = capsys.readouterr().out
    assert "indexed 3 occurrences" in out and "static vector" in out


def test_cli_fill_mask(tmp_path, minilm_dir, capsys):
    transformers = pytest.importorskip("transformers")
    from lmlab.cli import main

    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=64)
    transformers.BertForMaskedLM(config).save_pretrained(tmp_path)
    transformers.AutoTokenizer.from_pretrained(minilm_dir).save_pretrained(tmp_path)
    assert main(["fill-mask", str(tmp_path), "Paris is the [MASK] of [MASK].", "--top-k", "3",
                 "--json"]) == 0
    record = json.loads(capsys.readouterr().out.strip())
    assert len(record["masks"]) == 2 and all(len(m) == 3 for m in record["masks"])
    assert main(["fill-mask", str(tmp_path), "No mask here."]) == 2
    assert "no [MASK] token" in capsys.readouterr().err
