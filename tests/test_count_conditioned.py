"""Count-conditioned generation (lmlab.data.controls, scripts/count_conditioned.py): counts of
hand-written texts, the control prefix's round trip through text and tokens, the conditioned
corpora, and the script end to end at a toy size."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from lmlab.data.controls import (
    PROPERTIES,
    START,
    control_prefix,
    control_tokens,
    count_commas,
    count_sentences,
    count_words,
    meets,
    parse_prefix,
    passages,
    properties_of,
    write_conditioned_corpus,
)
from lmlab.text.corpus import Document, read_corpus
from lmlab.utils.errors import LmlabError

NAMES = ["words", "sentences", "commas"]
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("text, words, sentences, commas", [
    ("In the beginning God created the heaven and the earth.", 10, 1, 0),
    ("Mr. Smith went to Washington, D.C. on 2.5 days' notice. \"Why?\" he asked.", 13, 2, 1),
    ("Red, green, blue -- and 3 more. Done! Really?", 8, 3, 2),
    ("one , two,three", 2, 1, 2),  # words are whitespace-separated: "two,three" is one
    ("", 0, 0, 0),
])
def test_counts_of_hand_written_texts(text, words, sentences, commas):
    assert (count_words(text), count_sentences(text), count_commas(text)) == (
        words, sentences, commas)


def test_buckets_follow_the_papers_length_bins():
    words = PROPERTIES["words"]
    assert [words.bucket(n) for n in (0, 10, 11, 20, 21, 40, 41, 500)] == [
        "0-10", "0-10", "11-20", "11-20", "21-40", "21-40", "41+", "41+"]
    assert [PROPERTIES["sentences"].bucket(n) for n in (0, 1, 2, 3, 9)] == [None, "1", "2", "3+",
                                                                           "3+"]
    assert [PROPERTIES["commas"].bucket(n) for n in (0, 1, 2, 3, 7)] == ["0", "1", "2", "3+",
                                                                        "3+"]
    text = "A cat, a dog, a bird. They sat. " + "Word " * 20 + "end."
    assert properties_of(text, NAMES) == {"words": "21-40", "sentences": "3+", "commas": "2"}
    assert meets(text, {"words": "21-40", "commas": "1"}) == {"words": True, "commas": False}


def test_prefix_round_trip_in_text_and_tokens():
    from lmlab.tokenization.tokenizer import Tokenizer

    text = "Let there be light, and there was light."
    for labels in zip(*(PROPERTIES[n].labels[:3] for n in NAMES)):
        request = dict(zip(NAMES, labels))
        assert parse_prefix(control_prefix(request) + text) == (request, text)
    assert parse_prefix(START + text) == ({}, text)
    tokenizer = Tokenizer.train([text, "The dog barked, twice. Then it slept."] * 20, kind="bpe",
                                vocab_size=300, template="gpt2",
                                special_tokens=["<|endoftext|>", *control_tokens(NAMES)])
    request = {"words": "41+", "sentences": "2", "commas": "0"}
    ids = tokenizer.encode(control_prefix(request) + text, add_special_tokens=False)
    expected = [START, "<words=41+>", "<sentences=2>", "<commas=0>"]
    assert ids[:4] == tokenizer.convert_tokens_to_ids(expected)  # one token each
    assert tokenizer.decode(ids[4:]) == text
    assert parse_prefix(tokenizer.decode(ids)) == (request, text)
    with pytest.raises(LmlabError, match="no bucket"):
        control_prefix({"words": "12"})
    with pytest.raises(LmlabError, match="unknown counted property"):
        control_prefix({"colons": "1"})
    with pytest.raises(LmlabError, match="does not start"):
        parse_prefix(text)


def _write_corpus(folder: Path, documents: int = 60) -> Path:
    """A small corpus of varied, hand-made sentences (commas, lengths) in lmlab's format."""
    words = "the cat dog bird sat ran on a mat by river under old tree and slept".split()
    folder.mkdir(parents=True)
    for split, count in (("train", documents), ("validation", 6)):
        lines = []
        for d in range(count):
            sentences = []
            for s in range(1 + d % 5):
                n = 3 + (d * 7 + s * 5) % 25
                body = [words[(d + s + i * 3) % len(words)] for i in range(n)]
                for i in range(1 + s % 3, n - 1, 6):  # commas every sixth word
                    body[i] += ","
                sentences.append(" ".join(body).capitalize() + ".")
            lines.append(Document(f"{split}{d}", "hand", sentences).to_json())
        (folder / f"{split}.jsonl").write_text("".join(f"{ln}\n" for ln in lines))
    (folder / "manifest.json").write_text(json.dumps({"format": "lmlab-corpus"}))
    return folder


def test_conditioned_corpora_hold_the_same_texts(tmp_path):
    corpus = _write_corpus(tmp_path / "corpus")
    outs = {"conditioned": tmp_path / "c", "unconditioned": tmp_path / "u"}
    made = write_conditioned_corpus(corpus, outs, NAMES, max_sentences=3, max_words=60)
    conditioned = [d.sentences for d in read_corpus(outs["conditioned"])]
    plain = [d.sentences for d in read_corpus(outs["unconditioned"])]
    assert len(conditioned) == len(plain) == made.examples["train"] > 60
    for [with_prefix], [bare] in zip(conditioned, plain):
        request, text = parse_prefix(with_prefix)
        assert bare == START + text and request == properties_of(text, NAMES)
        assert count_words(text) <= 60
    total = made.examples["train"]
    assert all(sum(made.buckets[n].values()) == total for n in NAMES)
    assert sum(made.joint.values()) == total
    first = parse_prefix(conditioned[0][0])[0]
    assert made.base_rate(first) == sum(parse_prefix(c[0])[0] == first
                                        for c in conditioned) / total
    # passages cover a document's sentences in order, 1..3 at a time, the same way each time
    sentences = [f"S{i}." for i in range(10)]
    runs = list(passages(sentences, "doc", 3))
    assert " ".join(runs) == " ".join(sentences) and runs == list(passages(sentences, "doc", 3))
    assert all(1 <= len(r.split()) <= 3 for r in runs)


def test_script_end_to_end_at_toy_size(tmp_path):
    spec = importlib.util.spec_from_file_location("count_conditioned",
                                                  ROOT / "scripts" / "count_conditioned.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    corpus = _write_corpus(tmp_path / "corpus", documents=40)
    out = tmp_path / "out"
    argv = ["--corpus", str(corpus), "--work", str(tmp_path / "work"), "--out", str(out),
            "--vocab-size", "300", "--steps", "3", "--batch-size", "2", "--seq-len", "32",
            "--samples", "2", "--max-new-tokens", "8", "--min-share", "0.03"]
    assert script.main(argv) == 0
    result = json.loads((out / "count_conditioned.json").read_text())
    assert (out / "count_conditioned.png").stat().st_size > 0
    assert "| words | " in (out / "count_conditioned.md").read_text()
    settings = result["per_setting"]
    assert settings and all(s["n"] == 2 and 0 <= s["conditioned"] <= 1 for s in settings)
    assert all(s["base_rate"] >= 0.03 for s in settings)
    assert {r["property"] for r in result["per_bucket"]} == set(NAMES)
    assert result["models"]["conditioned"]["steps"] == 3
    assert script.main([*argv[:-2], "--min-share", "0.99"]) == 2  # no setting that common


def test_trainer_counts_tokens_under_per_document_masks():
    """clm's separate_documents turns the mask into (B, T, T): the trainer's token count (its
    throughput, token budget and cost) is the real tokens, not the allowed attention pairs."""
    import torch

    from lmlab.objectives.causal import CausalLM
    from lmlab.objectives.special_tokens import SpecialTokens
    from lmlab.training.trainer import _count_tokens

    special = SpecialTokens(vocab_size=100, pad_id=0, cls_id=1, sep_id=2, bos_id=1, eos_id=2)
    ids = torch.tensor([[5, 17, 33, 2, 60, 71, 9, 44], [5, 6, 2, 7, 8, 0, 0, 0]])
    padding = (ids != 0).long()
    batch = CausalLM(special, separate_documents=True).corrupt(
        {"input_ids": ids, "attention_mask": padding}, torch.Generator())
    assert batch["attention_mask"].dim() == 3 and _count_tokens(batch) == 13
    assert _count_tokens({"input_ids": ids, "attention_mask": padding}) == 13
