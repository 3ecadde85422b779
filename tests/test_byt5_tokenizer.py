"""ByT5's byte tokenizer against transformers' ``ByT5Tokenizer`` (test reference): ids on the
tokenizer parity texts (WordNet glosses, KJV verses, the hard cases) and on non-Latin scripts,
decoding (invalid UTF-8 included), pairs, padding and truncation, folders both ways (ours in
transformers, transformers' and google/byt5-style folders in lmlab, a fresh process), the CLI,
and a tiny random T5 v1.1 with 384 ids end to end (logits as transformers')."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import rounding_tolerance, run_lmlab
from test_tokenizer_parity import HARD_CASES, _kjv_verses, _wordnet_glosses

import lmlab
from lmlab.generation.generate import generate
from lmlab.tokenization.tokenizer import Tokenizer
from lmlab.utils.errors import LmlabError

transformers = pytest.importorskip("transformers")

SCRIPTS = [
    "你好，世界！这是一个用字节编码的中文句子。", "مرحبا بالعالم، هذه جملة عربية.",
    "नमस्ते दुनिया, यह हिन्दी का वाक्य है।", "emoji 😀🎉👍🏽 👨‍👩‍👧 🇯🇵 🏳️‍🌈",
    "ภาษาไทยไม่มีช่องว่าง", "Tiếng Việt có dấu", "ქართული ენა", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛 \U0010ffff",
]
SPECIAL_CASES = ["a <extra_id_0> b", "a<extra_id_3>b <pad>z", "x </s> y", "<unk>", "  lead",
                 "trail  ", "<extra_id_124>"]


@pytest.fixture(scope="module")
def texts() -> list[str]:
    sample = _wordnet_glosses(20000) + _kjv_verses(10000)
    assert len(sample) >= 20000, "WordNet / KJV text is not installed"
    return sample + HARD_CASES + SCRIPTS + SPECIAL_CASES


@pytest.fixture(scope="module")
def ours() -> Tokenizer:
    return Tokenizer.byt5()


@pytest.fixture(scope="module")
def reference():
    return transformers.ByT5Tokenizer()


def test_ids_match_byt5_tokenizer(ours, reference, texts):
    assert len(ours) == len(reference) == 384
    got = ours(texts)
    assert got["input_ids"] == reference(texts)["input_ids"]
    assert got["attention_mask"] == reference(texts)["attention_mask"]
    assert "token_type_ids" not in got
    assert ours("é")["input_ids"] == [0xC3 + 3, 0xA9 + 3, 1]  # the UTF-8 bytes + 3, then </s>
    assert [ours.pad_token_id, ours.eos_token_id, ours.unk_token_id] == [0, 1, 2]
    sentinels = [f"<extra_id_{i}>" for i in range(125)]
    assert ours.convert_tokens_to_ids(sentinels) == reference.convert_tokens_to_ids(sentinels)
    assert ours.additional_special_tokens == sentinels


def test_decoding_matches_and_round_trips(ours, reference, texts):
    ids = ours(texts[::7] + SCRIPTS + SPECIAL_CASES)["input_ids"]
    for skip in (False, True):
        assert ours.batch_decode(ids, skip_special_tokens=skip) == \
            reference.batch_decode(ids, skip_special_tokens=skip)
    plain = [t for t in texts if "<" not in t]
    assert ours.batch_decode(ours(plain)["input_ids"], skip_special_tokens=True) == plain
    # any ids, invalid UTF-8 among them (a model's output): ByT5Tokenizer drops invalid bytes
    rng = random.Random(0)
    rows = [[rng.randrange(384) for _ in range(rng.randrange(40))] for _ in range(2000)]
    rows += [[0xE4 + 3, 0xB8 + 3], [0xE4 + 3, 0xB8 + 3, 0xAD + 3, 0xFF + 3, 100]]
    for skip in (False, True):
        assert [ours.decode(row, skip_special_tokens=skip) for row in rows] == \
            reference.batch_decode(rows, skip_special_tokens=skip)
    assert ours.decode(torch.tensor([0xE4 + 3, 0xB8 + 3, 0xAD + 3, 1])) == "中</s>"


def test_pairs_padding_truncation_match(ours, reference, texts):
    # at most 80 and 240 bytes: only_first / only_second leave room for the other text
    firsts = [t[:20] for t in texts[:400:2] + SCRIPTS]
    seconds = [t[:60] for t in texts[1:400:2] + SCRIPTS[::-1]]
    settings = [{}, {"truncation": "longest_first", "max_length": 24, "padding": True},
                {"truncation": "only_second", "max_length": 120, "padding": "max_length"},
                {"truncation": "only_first", "max_length": 260},
                {"padding": True, "pad_to_multiple_of": 8, "padding_side": "left"}]
    for kwargs in settings:
        for pair in (seconds, None):
            a = ours(firsts, pair, return_tensors="pt", **kwargs) if kwargs.get("padding") \
                else ours(firsts, pair, **kwargs)
            b = reference(firsts, pair, return_tensors="pt", **kwargs) if kwargs.get("padding") \
                else reference(firsts, pair, **kwargs)
            for key in ("input_ids", "attention_mask"):
                same = a[key].equal(b[key]) if kwargs.get("padding") else a[key] == b[key]
                assert same, (kwargs, pair is None, key)
    left, ref_left = Tokenizer.byt5(), transformers.ByT5Tokenizer()
    left.truncation_side = ref_left.truncation_side = "left"
    assert left(firsts, seconds, truncation=True, max_length=16)["input_ids"] == \
        ref_left(firsts, seconds, truncation=True, max_length=16)["input_ids"]


def test_offsets_point_at_the_character_of_each_byte(ours):
    text = "Aé中😀 z"
    got = ours(text, return_offsets_mapping=True)
    spans = got["offset_mapping"][:-1]  # </s> has (0, 0)
    for token_id, (start, end) in zip(got["input_ids"], spans):
        assert token_id - 3 in text[start:end].encode("utf-8")
    assert [text[s:e] for s, e in dict.fromkeys(spans)] == list(text)


def _encode_in_fresh_process(folder, texts: list[str]) -> list[list[int]]:
    code = textwrap.dedent("""
        import json, sys
        from lmlab.tokenization.tokenizer import Tokenizer
        tok = Tokenizer.from_pretrained(sys.argv[1])
        print(json.dumps(tok(json.loads(sys.argv[2]))["input_ids"]))
    """)
    result = subprocess.run([sys.executable, "-c", code, str(folder), json.dumps(texts)],
                            capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


def test_saved_folder_loads_here_in_a_fresh_process_and_in_transformers(ours, tmp_path):
    probe = SCRIPTS + SPECIAL_CASES + ["plain text"]
    written = {p.name for p in ours.save_pretrained(tmp_path / "tok")}
    assert written == {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}
    assert _encode_in_fresh_process(tmp_path / "tok", probe) == ours(probe)["input_ids"]
    again = Tokenizer.from_pretrained(tmp_path / "tok")
    assert again.family == "byt5" and again.fingerprint() == ours.fingerprint()
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    assert type(theirs).__name__ == "ByT5Tokenizer" and len(theirs) == 384
    ids = ours(probe)["input_ids"]
    assert theirs(probe)["input_ids"] == ids
    assert theirs.batch_decode(ids, skip_special_tokens=True) == \
        ours.batch_decode(ids, skip_special_tokens=True)
    # fewer sentinels survive the round trip as well
    small = Tokenizer.byt5(extra_ids=3)
    small.save_pretrained(tmp_path / "small")
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "small"))
    assert len(theirs) == len(small) == 262
    assert theirs(probe)["input_ids"] == small(probe)["input_ids"]


def _hub_style_folder(folder, extra_ids: int = 125) -> None:
    """A google/byt5-* folder's tokenizer files: no vocabulary, the class named in config.json."""
    folder.mkdir(parents=True, exist_ok=True)
    sentinels = [f"<extra_id_{i}>" for i in range(extra_ids)]
    special = {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    (folder / "config.json").write_text(json.dumps(
        {"model_type": "t5", "vocab_size": 384, "tokenizer_class": "ByT5Tokenizer"}))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {**special, "extra_ids": extra_ids, "additional_special_tokens": sentinels}))
    (folder / "special_tokens_map.json").write_text(json.dumps(
        {**special, "additional_special_tokens": sentinels}))


def test_transformers_and_google_folders_load(tmp_path, texts):
    transformers.ByT5Tokenizer().save_pretrained(str(tmp_path / "saved-by-hf"))
    _hub_style_folder(tmp_path / "hub")
    _hub_style_folder(tmp_path / "hub-no-sentinels", extra_ids=0)
    probe = texts[:300] + SCRIPTS + SPECIAL_CASES
    for name in ("saved-by-hf", "hub", "hub-no-sentinels"):
        ours = Tokenizer.from_pretrained(tmp_path / name)
        theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path / name))
        assert ours.family == "byt5" and len(ours) == len(theirs), name
        assert ours(probe)["input_ids"] == theirs(probe)["input_ids"], name


def test_refusals(tmp_path):
    _hub_style_folder(tmp_path / "gap")
    config = json.loads((tmp_path / "gap" / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"] = {"300": {"content": "<extra_id_0>"}}
    (tmp_path / "gap" / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(LmlabError, match="259"):
        Tokenizer.from_pretrained(tmp_path / "gap")
    with pytest.raises(LmlabError, match="extra_ids must be at least 0"):
        Tokenizer.byt5(extra_ids=-1)
    with pytest.raises(LmlabError, match="Tokenizer.byt5"):
        Tokenizer.train(["some text"], kind="unigram", template="byt5")


def test_cli_writes_the_byte_tokenizer(tmp_path):
    result = run_lmlab("tokenizer", "train", "--kind", "byt5", "--out", tmp_path / "tok")
    assert result.returncode == 0, result.stderr
    assert Tokenizer.from_pretrained(tmp_path / "tok").fingerprint() == \
        Tokenizer.byt5().fingerprint()
    refused = run_lmlab("tokenizer", "train", "--kind", "byt5", "--files", tmp_path / "x",
                        "--out", tmp_path / "tok2")
    assert refused.returncode != 0 and "learns nothing from text" in refused.stderr
    refused = run_lmlab("tokenizer", "train", "--kind", "bpe", "--out", tmp_path / "tok3")
    assert refused.returncode != 0 and "--corpus" in refused.stderr


@pytest.mark.numerics
def test_tiny_t5_v11_with_the_byte_tokenizer_end_to_end(tmp_path):
    """A random T5 v1.1 (gated GELU, untied head) with ByT5's 384 ids, saved by transformers
    with ByT5Tokenizer's files: lmlab loads both, encodes padded multilingual batches with the
    same ids and gives the same logits; greedy generation gives the same ids and text."""
    # heads x d_kv != d_model, as in google/byt5-* (1472 wide, 6 heads of 64)
    config = transformers.T5Config(d_model=32, d_kv=16, d_ff=64, num_layers=2,
                                   num_decoder_layers=2, num_heads=4, vocab_size=384,
                                   relative_attention_num_buckets=8,
                                   relative_attention_max_distance=20,
                                   feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                                   decoder_start_token_id=0, dropout_rate=0.0,
                                   tokenizer_class="ByT5Tokenizer")
    torch.manual_seed(0)
    theirs = transformers.T5ForConditionalGeneration(config).eval()
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():  # off the initialisation: unit norms would hide a swapped tensor
        for param in theirs.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    folder = tmp_path / "byt5-tiny"
    theirs.save_pretrained(folder)
    transformers.ByT5Tokenizer().save_pretrained(str(folder))

    model, tok = lmlab.from_pretrained(folder), Tokenizer.from_pretrained(folder)
    reference = transformers.AutoTokenizer.from_pretrained(str(folder))
    sources = [SCRIPTS[0], "Translate: the cat sat.", SCRIPTS[1][:12], SCRIPTS[3]]
    targets = ["le chat", SCRIPTS[2][:20], "ok", "😀"]
    batch = tok(sources, padding=True, return_tensors="pt")
    labels = tok(targets, padding=True, return_tensors="pt")
    assert batch["input_ids"].equal(reference(sources, padding=True, return_tensors="pt")
                                    ["input_ids"])
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
              "decoder_input_ids": theirs._shift_right(labels["input_ids"]),
              "decoder_attention_mask": labels["attention_mask"]}
    with torch.no_grad():
        got, ref = model(**inputs).logits, theirs(**inputs).logits
    where = labels["attention_mask"].bool()
    scale = float(ref[where].abs().max())
    tolerance = min(rounding_tolerance(terms=64, depth=4, scale=scale), 1e-4)
    assert (got[where] - ref[where]).abs().max().item() <= tolerance

    ours_ids = generate(model, batch["input_ids"], batch["attention_mask"], max_new_tokens=12)
    ref_ids = theirs.generate(**{k: batch[k] for k in ("input_ids", "attention_mask")},
                              max_new_tokens=12, do_sample=False)
    assert ours_ids.tolist() == ref_ids.tolist()
    assert tok.batch_decode(ours_ids, skip_special_tokens=True) == \
        reference.batch_decode(ref_ids, skip_special_tokens=True)
