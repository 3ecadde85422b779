"""Attention maps, word merging and head statistics (lmlab/analysis/attention.py), the
``lmlab attention`` / ``lmlab head-stats`` commands and their refusals.

References: transformers' eager attention (``output_attentions=True``) on the same weights and
ids, for MiniLM (the real checkpoint), a tiny random GPT-2 and Llama, and a tiny random BART
(encoder, decoder and cross-attention). Head statistics are recomputed here with plain loops
from transformers' maps and tokenizer. Tolerance: float32 rounding of probabilities (size <= 1;
entropy up to log T) through the stacks' reductions (``rounding_tolerance``).
"""

from __future__ import annotations

import json
import math
import shutil
import unicodedata
import warnings

import numpy as np
import pytest
import torch
from conftest import (
    TOKENIZER_FILES,
    assert_clean_refusal,
    assert_close_rounding,
    rounding_tolerance,
    run_lmlab,
    run_lmlab_here,
)
from test_decoders import randomise

import lmlab
from lmlab.analysis import attention as A
from lmlab.load import load_model_and_tokenizer
from lmlab.utils.errors import LmlabError

transformers = pytest.importorskip("transformers")

TEXTS = [
    "The vase broke, and nobody knew why.",
    "Dawn broke over the hills.",
    "Tokenizers split unbelievable embeddings into pieces!",
    "He said: \"wait\" (twice).",
    "A short one.",
    "Students run the papers on a laptop; it works.",
]


def _probability_tolerance(hidden: int, layers: int, scale: float = 1.0) -> float:
    """Rounding of attention probabilities (or averages of them, size ``scale``) computed
    through ``layers`` layers of sums over ``hidden`` terms."""
    return rounding_tolerance(terms=hidden, depth=layers, scale=scale)


def _copy_tokenizer(folder, source) -> None:
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, folder / name)


@pytest.fixture(scope="module")
def minilm(minilm_dir):
    return load_model_and_tokenizer(minilm_dir)


@pytest.fixture(scope="module")
def minilm_hf(minilm_dir):
    return transformers.AutoModel.from_pretrained(minilm_dir, attn_implementation="eager").eval()


def save_tiny_bart(folder, minilm_dir):
    """A tiny random BART (2 encoder, 3 decoder layers, 4 heads) on MiniLM's vocabulary, with
    MiniLM's tokenizer files (so that ``attention_maps`` reads real text); decoder start token
    2 (BART's </s> id). Returns the folder."""
    torch.manual_seed(0)
    config = transformers.BartConfig(vocab_size=30522, d_model=32, encoder_layers=2,
                                     decoder_layers=3, encoder_attention_heads=4,
                                     decoder_attention_heads=4, encoder_ffn_dim=64,
                                     decoder_ffn_dim=64, max_position_embeddings=64,
                                     pad_token_id=0, decoder_start_token_id=2)
    randomise(transformers.BartForConditionalGeneration(config)).save_pretrained(folder)
    _copy_tokenizer(folder, minilm_dir)
    return folder


@pytest.fixture(scope="module")
def bart_folder(tmp_path_factory, minilm_dir):
    return save_tiny_bart(tmp_path_factory.mktemp("bart"), minilm_dir)


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory, minilm_dir):
    """A tiny random GPT-2 on MiniLM's vocabulary with MiniLM's tokenizer files."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=30522, n_embd=32, n_layer=2, n_head=4,
                                     n_positions=64, n_inner=48)
    folder = tmp_path_factory.mktemp("gpt2")
    randomise(transformers.GPT2LMHeadModel(config)).save_pretrained(folder)
    _copy_tokenizer(folder, minilm_dir)
    return folder


# ------------------------------------------------------------------------------ the model side
@pytest.mark.numerics
def test_attentions_only_when_asked_and_the_fused_path_agrees(minilm, bart_folder, monkeypatch):
    """Without output_attentions the fused kernel runs (once per layer) and no maps come back;
    asking for them selects the math path (no fused call) and leaves the outputs unchanged up
    to rounding."""
    model, tokenizer = minilm
    batch = tokenizer(TEXTS[:3], padding=True, return_tensors="pt")
    fused_calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: fused_calls.append(1) or sdpa(*a, **k))
    with torch.inference_mode():
        fused = model(**batch, heads=[])
        assert len(fused_calls) == 6
        math_path = model(**batch, heads=[], output_attentions=True)
        assert len(fused_calls) == 6
    assert fused.attentions is None
    assert len(math_path.attentions) == 6 and math_path.attentions[0].shape[:2] == (3, 12)
    real = batch["attention_mask"].bool()
    assert_close_rounding(math_path.last_hidden_state[real], fused.last_hidden_state[real],
                          terms=384, depth=6)

    seq2seq = lmlab.from_pretrained(bart_folder)
    ids = torch.tensor([[101, 2023, 2003, 102]])
    with torch.inference_mode():
        out = seq2seq(input_ids=ids, decoder_input_ids=ids)
        asked = seq2seq(input_ids=ids, decoder_input_ids=ids, output_attentions=True)
    assert out.attentions is None and out.encoder_attentions is None
    assert out.cross_attentions is None
    assert len(asked.encoder_attentions) == 2 and len(asked.cross_attentions) == 3


def _check_maps(ours: torch.Tensor, theirs, real_queries: torch.Tensor, hidden: int,
                what: str) -> None:
    """Ours (L, B, H, Tq, Tk) against transformers' tuple of (B, H, Tq, Tk), at real queries."""
    theirs = torch.stack([t.float() for t in theirs])
    assert ours.shape == theirs.shape, (what, ours.shape, theirs.shape)
    keep = real_queries[None, :, None, :]  # (1, B, 1, Tq)
    diff = (ours - theirs).abs().amax(-1).masked_select(keep).max().item()
    tolerance = _probability_tolerance(hidden, ours.shape[0])
    assert diff <= tolerance, f"{what}: max |diff| {diff:.3g} > {tolerance:.3g}"


@pytest.mark.numerics
def test_minilm_maps_equal_transformers(minilm, minilm_hf):
    model, tokenizer = minilm
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    ours = A.model_attentions(model, batch["input_ids"], batch["attention_mask"],
                              batch["token_type_ids"])
    assert list(ours) == ["encoder"]
    with torch.no_grad():
        theirs = minilm_hf(**batch, output_attentions=True).attentions
    _check_maps(ours["encoder"], theirs, batch["attention_mask"].bool(), 384, "minilm")

    maps = A.attention_maps(model, tokenizer, TEXTS[0], pair=TEXTS[1])
    single = tokenizer(TEXTS[0], TEXTS[1], return_tensors="pt")
    with torch.no_grad():
        reference = minilm_hf(**single, output_attentions=True).attentions
    assert maps.kind == "encoder" and maps.tokens == single.tokens(0)
    _check_maps(maps.attentions[:, None], reference,
                torch.ones(1, len(maps.tokens), dtype=torch.bool), 384, "attention_maps")


@pytest.mark.numerics
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_decoder_maps_equal_transformers(tmp_path, family):
    if family == "gpt2":
        config = transformers.GPT2Config(vocab_size=97, n_embd=32, n_layer=2, n_head=4,
                                         n_positions=64, n_inner=48)
    else:
        config = transformers.LlamaConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2,
                                          intermediate_size=48, max_position_embeddings=64)
    theirs = randomise(transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="eager"))
    theirs.save_pretrained(tmp_path)
    ours = lmlab.from_pretrained(tmp_path)
    ids = torch.tensor([[5, 17, 33, 2, 60, 71, 9, 44], [8, 90, 12, 3, 3, 3, 3, 3]])
    mask = torch.tensor([[1] * 8, [1] * 3 + [0] * 5])
    got = A.model_attentions(ours, ids, mask)
    assert list(got) == ["decoder"]
    with torch.no_grad():
        reference = theirs(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    _check_maps(got["decoder"], reference, mask.bool(), 48, family)
    assert got["decoder"][0, 0, 0].triu(1).abs().max() == 0  # causal: nothing from the future


def test_encoder_decoder_maps_equal_transformers(bart_folder):
    ours = lmlab.from_pretrained(bart_folder)
    theirs = transformers.BartForConditionalGeneration.from_pretrained(
        bart_folder, attn_implementation="eager").eval()
    src = torch.tensor([[101, 7592, 2088, 999, 102], [101, 2023, 102, 0, 0]])
    src_mask = (src != 0).long()
    tgt = torch.tensor([[2, 101, 2023, 2003], [2, 101, 2009, 0]])
    tgt_mask = (tgt != 0).long()
    got = A.model_attentions(ours, src, src_mask, decoder_input_ids=tgt,
                             decoder_attention_mask=tgt_mask)
    with torch.no_grad():
        ref = theirs(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt,
                     decoder_attention_mask=tgt_mask, output_attentions=True)
    _check_maps(got["encoder"], ref.encoder_attentions, src_mask.bool(), 64, "encoder")
    _check_maps(got["decoder"], ref.decoder_attentions, tgt_mask.bool(), 64, "decoder")
    _check_maps(got["cross"], ref.cross_attentions, tgt_mask.bool(), 64, "cross")

    model, tokenizer = load_model_and_tokenizer(bart_folder)
    maps = A.attention_maps(model, tokenizer, "The vase broke.", target="Dawn broke.")
    assert maps.kind == "encoder-decoder"
    assert maps.target_tokens[0] == tokenizer.convert_ids_to_tokens(2)  # the start token
    assert maps.target_tokens[1:] == tokenizer("Dawn broke.").tokens()
    n_src, n_tgt = len(maps.tokens), len(maps.target_tokens)
    assert maps.attentions.shape == (2, 4, n_src, n_src)
    assert maps.decoder_attentions.shape == (3, 4, n_tgt, n_tgt)
    assert maps.cross_attentions.shape == (3, 4, n_tgt, n_src)
    ids = torch.tensor([tokenizer.convert_tokens_to_ids(maps.target_tokens)])
    with torch.no_grad():
        ref = theirs(**tokenizer("The vase broke.", return_tensors="pt",
                                 return_token_type_ids=False),
                     decoder_input_ids=ids, output_attentions=True)
    _check_maps(maps.cross_attentions[:, None], ref.cross_attentions,
                torch.ones(1, n_tgt, dtype=torch.bool), 64, "attention_maps cross")
    assert [v[0] for v in maps.views()] == ["encoder", "decoder", "cross"]
    encoder_only = A.attention_maps(model, tokenizer, "The vase broke.")
    assert encoder_only.target is None and len(encoder_only.views()) == 1


# ------------------------------------------------------------------------------ words
@pytest.mark.numerics
def test_words_sum_columns_average_rows_and_keep_rows_stochastic(minilm):
    model, tokenizer = minilm
    maps = A.attention_maps(model, tokenizer, "Tokenizers split unbelievable embeddings.",
                            pair="It works.")
    source = maps.source
    assert maps.tokens[:4] == ["[CLS]", "token", "##izer", "##s"]
    assert source.words[:5] == ["[CLS]", "Tokenizers", "split", "unbelievable", "embeddings"]
    assert source.groups[1] == [1, 2, 3]
    assert [source.words[i] for i, g in enumerate(source.groups)
            if all(source.special[p] for p in g)] == ["[CLS]", "[SEP]", "[SEP]"]
    assert all(len(g) == 1 for g, w in zip(source.groups, source.words) if w == "[SEP]")
    words = maps.words()
    assert words.level == "word" and words.tokens == source.words
    assert words.attentions.shape == (6, 12, len(source.words), len(source.words))
    assert_close_rounding(words.attentions.sum(-1), torch.ones(words.attentions.shape[:-1]),
                          terms=len(maps.tokens))
    # by hand: "Tokenizers" (pieces 1-3) to "embeddings" (pieces 6-9), layer 3 head 4
    pieces_from, pieces_to = source.groups[1], source.groups[4]
    expected = maps.attentions[3, 4][pieces_from][:, pieces_to].sum(1).mean()
    assert_close_rounding(words.attentions[3, 4, 1, 4], expected, terms=12)
    assert words.words() is words


@pytest.mark.numerics
def test_word_merge_of_cross_attention_keeps_rows_stochastic(bart_folder):
    model, tokenizer = load_model_and_tokenizer(bart_folder)
    maps = A.attention_maps(model, tokenizer, "Unbelievable embeddings.",
                            target="Tokenizers work.")
    words = maps.words()
    # the start token, then the target as the (BERT-template) tokenizer encodes it
    assert words.target.tokens[:3] == [tokenizer.convert_ids_to_tokens(2), "[CLS]", "Tokenizers"]
    assert words.source.tokens[1] == "Unbelievable"
    for tensor in (words.attentions, words.decoder_attentions, words.cross_attentions):
        assert_close_rounding(tensor.sum(-1), torch.ones(tensor.shape[:-1]), terms=16)
    assert words.cross_attentions.shape[-2:] == (len(words.target.tokens),
                                                 len(words.source.tokens))


# ------------------------------------------------------------------------------ statistics
def test_statistics_of_hand_made_maps():
    """Identity maps: all attention on the token itself, zero entropy; uniform maps over n
    real keys: 1/n to each key, entropy log n; padding excluded from queries and keys."""
    length, real = 5, 4
    mask = torch.tensor([[1] * real + [0]])
    sep = torch.tensor([[False, False, False, True, False]])
    punct = torch.tensor([[False, False, True, False, False]])
    identity = torch.eye(length)[None, None, None]  # (L=1, B=1, H=1, T, T)
    sums = A.batch_statistics(identity, mask, sep, punct)
    per_token = {name: float(value[0, 0]) / real for name, value in sums.items()}
    assert per_token == {"cls": 0.25, "sep": 0.25, "punct": 0.25, "prev": 0.0, "next": 0.0,
                         "self": 1.0, "entropy": 0.0}
    uniform = torch.zeros(length, length)
    uniform[:, :real] = 1.0 / real
    sums = A.batch_statistics(uniform[None, None, None], mask, sep, punct)
    per_token = {name: float(value[0, 0]) / real for name, value in sums.items()}
    expected = {"cls": 0.25, "sep": 0.25, "punct": 0.25, "prev": 0.75 / 4, "next": 0.75 / 4,
                "self": 0.25, "entropy": math.log(real)}
    for name, value in expected.items():
        assert abs(per_token[name] - value) < 1e-12, (name, per_token[name], value)


def _reference_statistics(hf_model, hf_tokenizer, texts, batch_size):
    """Clark et al.'s statistics from transformers' maps, with plain loops (no lmlab code)."""
    layers, heads = hf_model.config.num_hidden_layers, hf_model.config.num_attention_heads
    names = ["cls", "sep", "punct", "prev", "next", "self", "entropy"]
    sums = {name: np.zeros((layers, heads)) for name in names}
    count = 0
    for start in range(0, len(texts), batch_size):
        batch = hf_tokenizer(texts[start:start + batch_size], padding=True, return_tensors="pt")
        with torch.no_grad():
            maps = hf_model(**batch, output_attentions=True).attentions
        for row in range(batch["input_ids"].shape[0]):
            ids = batch["input_ids"][row].tolist()
            n = int(batch["attention_mask"][row].sum())
            tokens = hf_tokenizer.convert_ids_to_tokens(ids[:n])
            seps = [j for j in range(1, n) if ids[j] == hf_tokenizer.sep_token_id]
            puncts = [j for j in range(n) if tokens[j].removeprefix("##") and
                      ids[j] not in hf_tokenizer.all_special_ids and
                      all(unicodedata.category(c)[0] == "P" for c in tokens[j])]
            count += n
            for layer in range(layers):
                for head in range(heads):
                    a = maps[layer][row, head].double().numpy()
                    for i in range(n):
                        p = a[i, :n]
                        sums["cls"][layer, head] += p[0]
                        sums["sep"][layer, head] += sum(p[j] for j in seps)
                        sums["punct"][layer, head] += sum(p[j] for j in puncts)
                        sums["prev"][layer, head] += p[i - 1] if i > 0 else 0.0
                        sums["next"][layer, head] += p[i + 1] if i + 1 < n else 0.0
                        sums["self"][layer, head] += p[i]
                        sums["entropy"][layer, head] -= sum(x * math.log(x) for x in p if x > 0)
    return {name: value / count for name, value in sums.items()}, count


@pytest.mark.numerics
def test_head_statistics_equal_an_independent_computation_from_transformers(
        minilm, minilm_hf, minilm_dir):
    model, tokenizer = minilm
    stats = A.head_statistics(model, tokenizer, TEXTS, batch_size=4)  # padded batches
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    reference, count = _reference_statistics(minilm_hf, hf_tokenizer, TEXTS, batch_size=3)
    assert stats.texts == len(TEXTS) and stats.tokens == count and stats.truncated == 0
    assert list(stats.values) == list(A.STATISTICS)
    for name, expected in reference.items():
        scale = math.log(40) if name == "entropy" else 1.0
        tolerance = _probability_tolerance(384, 6, scale)
        diff = np.abs(stats.values[name] - expected).max()
        assert diff <= tolerance, f"{name}: max |diff| {diff:.3g} > {tolerance:.3g}"
    assert stats.values["punct"].max() > 0.05 and stats.values["sep"].max() > 0.05
    assert stats.values["next"].max() > 0.2 and stats.values["prev"].max() > 0.2


def test_statistics_table_json_and_plot(minilm, tmp_path):
    model, tokenizer = minilm
    stats = A.head_statistics(model, tokenizer, TEXTS[:2], sample="two texts")
    files = A.write_head_statistics(stats, tmp_path)
    assert [f.name for f in files] == ["head_stats.json", "head_stats.csv", "head_stats.md",
                                       "head_stats.png"]
    loaded = A.HeadStatistics.from_json(json.loads(files[0].read_text()))
    for name, grid in stats.values.items():
        assert np.abs(loaded.values[name] - grid).max() < 1e-6  # tol: the JSON keeps 6 decimals (error <= 5e-7)
    csv = files[1].read_text().splitlines()
    assert csv[0] == "layer,head," + ",".join(A.STATISTICS) and len(csv) == 1 + 6 * 12
    layer, head, value = stats.top("sep", 1)[0]
    assert value == stats.values["sep"].max() and f"{layer}.{head} ({value:.2f})" in files[2].read_text()
    assert files[3].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_default_sample_is_real_fixed_text():
    sample = A.default_sample(50)
    assert len(sample) == 50 == len(set(sample)) and sample == A.default_sample(50)
    assert all(len(s.split()) >= 3 for s in sample)
    texts, description = A.text_sample(10)
    assert texts == A.default_sample(10) and "WordNet" in description


# ------------------------------------------------------------------------------ bad input
def test_long_text_is_cut_and_said(minilm):
    model, tokenizer = minilm
    with pytest.warns(UserWarning, match="the text has 602 tokens.*cut to 512"):
        maps = A.attention_maps(model, tokenizer, "word " * 600)
    assert maps.attentions.shape[-1] == 512 and maps.truncated_from == {"text": (602, 512)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        short = A.attention_maps(model, tokenizer, "word " * 20, max_length=30)
    assert short.truncated_from == {}
    stats = A.head_statistics(model, tokenizer, ["word " * 40, "a short text"], max_length=16)
    assert stats.truncated == 1 and stats.tokens == 16 + 5


def test_api_refusals(minilm, gpt2_folder):
    model, tokenizer = minilm
    with pytest.raises(LmlabError, match="no decoder reading a source"):
        A.attention_maps(model, tokenizer, "a text", target="another")
    with pytest.raises(LmlabError, match="empty"):
        A.attention_maps(model, tokenizer, "  ")
    decoder, decoder_tokenizer = load_model_and_tokenizer(gpt2_folder)
    with pytest.raises(LmlabError, match="decoder-only model reads one text"):
        A.attention_maps(decoder, decoder_tokenizer, "a text", pair="another")
    with pytest.raises(LmlabError, match="decoder-only model reads one text"):
        A.head_statistics(decoder, decoder_tokenizer, ["a"], pairs=["b"])
    with pytest.raises(LmlabError, match="no text"):
        A.head_statistics(model, tokenizer, [])


def test_cli_refuses_bad_input_before_work(tmp_path, gpt2_folder):
    out = tmp_path / "view.html"
    assert_clean_refusal(run_lmlab_here("attention", tmp_path / "nope", "a text", "--out", out),
                         "does not exist")
    assert_clean_refusal(run_lmlab_here("attention", "minilm", "a text", "--out", tmp_path / "v.txt"),
                         "not an .html file", fix=".html")
    out.write_text("mine")
    assert_clean_refusal(run_lmlab_here("attention", "minilm", "a text", "--out", out),
                         "already exists", fix="--overwrite")
    assert out.read_text() == "mine"
    fresh = tmp_path / "fresh.html"
    assert_clean_refusal(run_lmlab_here("attention", gpt2_folder, "a text", "--pair", "b",
                                   "--out", fresh), "decoder-only model reads one text")
    assert_clean_refusal(run_lmlab_here("attention", "minilm", "a text", "--target", "b",
                                   "--out", fresh), "no decoder reading a source")
    assert_clean_refusal(run_lmlab_here("attention", "minilm", "a text", "--layer", "6",
                                   "--out", fresh), "--layer 6 does not exist", fix="0 to 5")
    assert_clean_refusal(run_lmlab_here("attention", "minilm", "a text", "--head", "12",
                                   "--out", fresh), "--head 12 does not exist")
    assert_clean_refusal(run_lmlab_here("attention", "minilm", "a text", "--corpus", tmp_path,
                                   "--out", fresh), "--corpus is only read for --stats-sample")
    assert not fresh.exists()
    folder = tmp_path / "stats"
    folder.mkdir()
    (folder / "keep.txt").write_text("x")
    assert_clean_refusal(run_lmlab_here("head-stats", "minilm", "--out", folder), "already holds")
    assert_clean_refusal(run_lmlab_here("head-stats", "minilm", "--text-file", tmp_path / "no.txt",
                                   "--out", tmp_path / "s2"), "does not exist")
    assert_clean_refusal(run_lmlab_here("head-stats", "minilm", "--sample", "0", "--out",
                                   tmp_path / "s2"), "--sample must be at least 1")
    assert not (tmp_path / "s2").exists()


def test_cli_cuts_long_text_says_so_and_writes_the_page(tmp_path):
    out = tmp_path / "view.html"
    result = run_lmlab("attention", "minilm", "the cat sat on the mat " * 10, "--max-length",
                       "16", "--out", out)
    assert result.returncode == 0, result.stderr
    assert "note: the text has 62 tokens, more than the model takes: it was cut to 16" \
        in result.stdout
    page = out.read_text()
    assert "cut to 16" in page and '"layers":6' in page


def test_head_stats_cli_writes_what_the_api_computes(tmp_path, minilm):
    text_file = tmp_path / "texts.txt"
    text_file.write_text("\n".join(TEXTS) + "\n\n")
    out = tmp_path / "stats"
    result = run_lmlab("head-stats", "minilm", "--text-file", text_file, "--sample", "4",
                       "--out", out)
    assert result.returncode == 0, result.stderr
    assert "| sep: attention to separator tokens" in result.stdout
    saved = A.HeadStatistics.from_json(json.loads((out / "head_stats.json").read_text()))
    model, tokenizer = minilm
    expected = A.head_statistics(model, tokenizer, TEXTS[:4])
    assert saved.texts == 4 and saved.tokens == expected.tokens
    for name, grid in expected.values.items():  # MiniLM in another process, 6 decimals kept
        assert_close_rounding(saved.values[name], grid, terms=384, depth=6, dtype=torch.float32,
                              scale=max(1.0, float(np.abs(grid).max())))
    assert (out / "head_stats.png").stat().st_size > 1000


def test_a_max_length_beyond_the_model_is_refused(minilm):
    """A --max-length the position table cannot hold is refused with the limit, not an
    IndexError from the embedding look-up."""
    from lmlab.analysis.features import FeatureExtractor

    model, tok = minilm
    with pytest.raises(LmlabError, match="more than this model takes"):
        A.attention_maps(model, tok, "The vase broke.", max_length=1000)
    with pytest.raises(LmlabError, match="more than this model takes"):
        A.head_statistics(model, tok, ["The vase broke."], max_length=1000)
    with pytest.raises(LmlabError, match="more than this model takes"):
        FeatureExtractor(model, tok, max_length=1000)
