"""Token shards: building from a real-text corpus, random access, bounded resume after SIGKILL,
and the errors a user can hit."""

from __future__ import annotations

import filecmp
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from lmlab.data.shard_reader import ShardReader
from lmlab.data.shards import build_shards, token_dtype
from lmlab.tokenization.tokenizer import Tokenizer
from lmlab.utils.errors import LmlabError


def _gloss_documents(limit: int) -> list[list[str]]:
    """WordNet synsets as documents, the ';'-separated parts of each gloss as sentences."""
    from lmlab.utils.paths import find_system_path

    path = find_system_path("usr/share/wordnet/data.noun")
    assert path is not None, "wordnet-base is not installed"
    docs = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.startswith(" ") or "|" not in line:
                continue
            docs.append([s.strip() for s in line.split("|", 1)[1].split(";") if s.strip()])
            if len(docs) == limit:
                break
    return docs


def write_corpus(folder: Path, glosses: list[list[str]], per_doc: int = 4) -> Path:
    """An lmlab corpus (train + validation JSON lines) of real WordNet glosses."""
    folder.mkdir(parents=True, exist_ok=True)
    cut = len(glosses) * 9 // 10
    for split, part in (("train", glosses[:cut]), ("validation", glosses[cut:])):
        with open(folder / f"{split}.jsonl", "w", encoding="utf-8") as handle:
            for i in range(0, len(part), per_doc):
                sentences = [s for g in part[i:i + per_doc] for s in g]
                if i == 0:
                    sentences.insert(1, "")  # an empty sentence must be skipped cleanly
                handle.write(json.dumps({"id": f"wn/{split}/{i}", "source": "wordnet",
                                         "sentences": sentences}) + "\n")
    return folder


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"), _gloss_documents(2400))


@pytest.fixture(scope="module")
def tokenizer(minilm_dir) -> Tokenizer:
    return Tokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def built(corpus, tokenizer, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("shards")
    build_shards(tokenizer, corpus, out, shard_tokens=4096, show_progress=False)
    return out


def _documents(corpus: Path, split: str = "train") -> list[list[str]]:
    with open(corpus / f"{split}.jsonl", encoding="utf-8") as handle:
        return [json.loads(line)["sentences"] for line in handle]


def test_shards_hold_every_document_and_sentence(built, corpus, tokenizer):
    reader = ShardReader(built, "train", tokenizer=tokenizer)
    documents = _documents(corpus)
    assert len(reader) == len(documents) and len(reader.info["shards"]) > 3
    engine = tokenizer.backend_tokenizer
    sentence = 0
    for index, sentences in enumerate(documents):
        encoded = [engine.encode(s, add_special_tokens=False).ids for s in sentences]
        encoded = [e for e in encoded if e]
        assert reader.document(index).tolist() == [t for e in encoded for t in e]
        got = reader.document_sentences(index)
        assert [g.tolist() for g in got] == encoded
        sentence += len(encoded)
    assert reader.num_sentences == sentence
    assert reader.num_tokens == sum(s["num_tokens"] for s in reader.info["shards"])
    assert reader.document(0).dtype == np.int64
    manifest = json.loads((built / "manifest.json").read_text())
    assert manifest["dtype"] == "uint16" and manifest["splits"]["validation"]["complete"]
    assert (built / "train-00000.bin").stat().st_size == 4096 * 2  # raw uint16


def test_windows_cross_shard_boundaries(built):
    reader = ShardReader(built, "train")
    whole = np.concatenate([np.fromfile(built / s["files"]["tokens"]["file"], dtype=np.uint16)
                            for s in reader.info["shards"]])
    for start, length in ((0, 10), (4090, 12), (4096 * 2 - 1, 4098), (reader.num_tokens - 5, 5)):
        assert reader.window(start, length).tolist() == whole[start:start + length].tolist()
    with pytest.raises(LmlabError, match="outside"):
        reader.window(reader.num_tokens - 2, 5)


def test_word_start_mask_follows_word_ids(built, corpus, tokenizer):
    reader = ShardReader(built, "train")
    sentences = [s for s in _documents(corpus)[5] if s]
    expected = []
    for sentence in sentences:
        words = tokenizer.backend_tokenizer.encode(sentence, add_special_tokens=False).word_ids
        expected += [1] + [int(a != b) for a, b in zip(words[1:], words[:-1])]
    mask = reader.document_word_starts(5)
    assert mask.tolist() == expected
    assert 0 < mask.sum() < len(mask)  # real sub-word continuations exist
    tokens = tokenizer.convert_ids_to_tokens(reader.document(5).tolist())
    assert all(m == 0 for m, t in zip(mask, tokens) if t.startswith("##"))


def test_workers_give_identical_shards(built, corpus, tokenizer, tmp_path):
    build_shards(tokenizer, corpus, tmp_path, shard_tokens=4096, workers=2, show_progress=False)
    names = sorted(p.name for p in built.iterdir())
    assert names == sorted(p.name for p in tmp_path.iterdir())
    match, mismatch, errors = filecmp.cmpfiles(built, tmp_path, names, shallow=False)
    assert not mismatch and not errors


_KILLED_RUN = """
import sys, time
from lmlab.data import shards
from lmlab.data.shards import build_shards
from lmlab.tokenization.tokenizer import Tokenizer
write = shards.atomic_write_json
def slow_write(*args, **kwargs):  # 0.3 s after each manifest update: time to kill us midway
    write(*args, **kwargs)
    time.sleep(0.3)
shards.atomic_write_json = slow_write
build_shards(Tokenizer.from_pretrained(sys.argv[1]), sys.argv[2], sys.argv[3],
             shard_tokens=4096, show_progress=False)
"""


def test_sigkill_midway_then_resume_is_byte_identical(built, corpus, minilm_dir, tokenizer,
                                                      tmp_path):
    out = tmp_path / "shards"
    process = subprocess.Popen([sys.executable, "-c", _KILLED_RUN, str(minilm_dir),
                                str(corpus), str(out)])
    manifest = out / "manifest.json"
    deadline = time.time() + 60
    while time.time() < deadline:
        if manifest.exists() and len(json.loads(manifest.read_text())["splits"].get(
                "train", {}).get("shards", [])) >= 2:
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    partial = json.loads(manifest.read_text())
    assert not partial["splits"]["train"]["complete"]
    with pytest.raises(LmlabError, match="incomplete"):
        ShardReader(out, "train")
    result = build_shards(tokenizer, corpus, out, shard_tokens=4096, show_progress=False)
    assert result["resumed_shards"] >= 2
    names = sorted(p.name for p in built.iterdir())
    assert names == sorted(p.name for p in out.iterdir())  # no partial files left
    _, mismatch, errors = filecmp.cmpfiles(built, out, names, shallow=False)
    assert not mismatch and not errors


def test_corrupted_shard_is_rebuilt(built, corpus, tokenizer, tmp_path):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(built, out)
    with open(out / "train-00001.bin", "r+b") as handle:
        handle.write(b"\xff\xff")
    result = build_shards(tokenizer, corpus, out, shard_tokens=4096, show_progress=False)
    assert result["resumed_shards"] < len(result["splits"]["train"]["shards"])
    assert filecmp.cmp(built / "train-00001.bin", out / "train-00001.bin", shallow=False)


def test_other_tokenizer_is_refused(built, tmp_path):
    other = Tokenizer.train(iter([" ".join(g) for g in _gloss_documents(300)]),
                            kind="wordpiece", vocab_size=500)
    with pytest.raises(LmlabError, match="another tokenizer"):
        ShardReader(built, "train", tokenizer=other)


def test_missing_manifest_and_empty_corpus(tmp_path, tokenizer):
    with pytest.raises(LmlabError, match="manifest.json"):
        ShardReader(tmp_path, "train")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "train.jsonl").write_text(
        json.dumps({"id": "x", "source": "s", "sentences": ["", " "]}) + "\n", encoding="utf-8")
    with pytest.raises(LmlabError, match="no tokens"):
        build_shards(tokenizer, empty, tmp_path / "out", show_progress=False)
    with pytest.raises(LmlabError, match="not an lmlab corpus"):
        build_shards(tokenizer, tmp_path / "nothing", tmp_path / "out2", show_progress=False)


def test_dtype_choice():
    assert token_dtype(30522) == "uint16" and token_dtype(65536) == "uint16"
    assert token_dtype(65537) == "uint32"


def test_cli_data_tokenize(corpus, minilm_dir, tmp_path, capsys):
    from lmlab.cli import main

    out = tmp_path / "shards"
    assert main(["data", "tokenize", "--tokenizer", str(minilm_dir), "--corpus", str(corpus),
                 "--out", str(out), "--shard-tokens", "20000"]) == 0
    assert "train:" in capsys.readouterr().out
    assert ShardReader(out, "validation").num_documents > 0
