"""Bad input to the data and tokenizer commands, run as a user runs them: in a subprocess.

Each case asserts exit code 2, an error that names the problem and a fix, and that the files on
disk are exactly as they were (nothing written, nothing deleted).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import assert_clean_refusal, disk_snapshot, run_lmlab, run_lmlab_here

from lmlab.utils.paths import find_system_path


def _glosses(limit: int) -> list[str]:
    """Real English text: the first ``limit`` WordNet noun glosses."""
    path = find_system_path("usr/share/wordnet/data.noun")
    if path is None:
        pytest.skip("wordnet-base is not installed")
    texts = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if not line.startswith(" ") and "|" in line:
                texts.append(line.split("|", 1)[1].strip())
                if len(texts) == limit:
                    break
    return texts


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("text") / "glosses.txt"
    path.write_text("\n".join(_glosses(400)) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A small lmlab corpus of real glosses (written directly: the format is JSON lines)."""
    folder = tmp_path_factory.mktemp("corpus")
    glosses = _glosses(400)
    for split, part in (("train", glosses[:360]), ("validation", glosses[360:])):
        with open(folder / f"{split}.jsonl", "w", encoding="utf-8") as handle:
            for i in range(0, len(part), 4):
                handle.write(json.dumps({"id": f"wn/{split}/{i}", "source": "wordnet",
                                         "sentences": part[i:i + 4]}) + "\n")
    return folder


# ----------------------------------------------------------------------------- tokenizer train

def test_tokenizer_train_on_a_missing_file_is_refused(tmp_path):
    out = tmp_path / "tok"
    result = run_lmlab_here("tokenizer", "train", "--files", tmp_path / "missing.txt",
                       "--vocab-size", 200, "--out", out)
    assert_clean_refusal(result, "not found", "missing.txt", fix="check the paths")
    assert not out.exists()


@pytest.mark.parametrize("where", ["early", "late"])
def test_tokenizer_train_names_file_and_byte_offset_of_a_bad_byte(tmp_path, text_file, where):
    good = text_file.read_bytes()
    bad = tmp_path / "bad.txt"
    if where == "early":  # once "the training iterator holds no text"
        data, offset = b"Caf\xe9 au lait\n" + good, 3
    else:  # once an offset inside a 1 MiB read chunk, without the file's name
        data = good * (1 + (1 << 21) // len(good))
        offset = len(data) + 5
        data += b"late \xff byte\n" + good
    bad.write_bytes(data)
    out = tmp_path / "tok"
    before = disk_snapshot(tmp_path)
    result = run_lmlab_here("tokenizer", "train", "--files", bad, "--vocab-size", 300, "--out", out)
    assert_clean_refusal(result, f"{bad}: byte {offset} ", "is not UTF-8",
                         fix="--encoding-errors replace")
    assert disk_snapshot(tmp_path) == before
    if where == "early":  # the documented option reads it
        result = run_lmlab("tokenizer", "train", "--files", bad, "--vocab-size", 300,
                           "--out", out, "--encoding-errors", "replace")
        assert result.returncode == 0, result.stderr
        assert (out / "tokenizer.json").is_file()


def test_tokenizer_train_into_a_folder_holding_something_is_refused(tmp_path, text_file):
    out = tmp_path / "tok"
    out.mkdir()
    (out / "notes.md").write_text("mine\n")
    before = disk_snapshot(out)
    result = run_lmlab_here("tokenizer", "train", "--files", text_file, "--vocab-size", 300,
                       "--out", out)
    assert_clean_refusal(result, str(out), "notes.md", fix="--overwrite")
    assert disk_snapshot(out) == before
    result = run_lmlab("tokenizer", "train", "--files", text_file, "--vocab-size", 300,
                       "--out", out, "--overwrite")
    assert result.returncode == 0, result.stderr
    assert (out / "notes.md").read_text() == "mine\n"  # --overwrite replaces only our files


# ----------------------------------------------------------------------------- data tokenize

def test_data_tokenize_refuses_to_delete_shards_of_another_tokenizer(tmp_path, corpus,
                                                                     minilm_dir, text_file):
    from lmlab.data.shards import build_shards
    from lmlab.tokenization.tokenizer import Tokenizer

    out = tmp_path / "shards"
    build_shards(Tokenizer.from_pretrained(minilm_dir), corpus, out, shard_tokens=4096,
                 show_progress=False)
    other = tmp_path / "other-tok"
    Tokenizer.train(text_file, vocab_size=400).save_pretrained(other)
    before, contents = disk_snapshot(out), disk_snapshot(out, times=False)
    result = run_lmlab_here("data", "tokenize", "--tokenizer", other, "--corpus", corpus,
                       "--out", out, "--shard-tokens", 4096)
    assert_clean_refusal(result, str(out), "another tokenizer", fix="--overwrite")
    assert disk_snapshot(out) == before
    # the same tokenizer and settings resume (no --overwrite needed; same files, same bytes) ...
    result = run_lmlab("data", "tokenize", "--tokenizer", minilm_dir, "--corpus", corpus,
                       "--out", out, "--shard-tokens", 4096)
    assert result.returncode == 0, result.stderr
    assert disk_snapshot(out, times=False) == contents
    # ... and --overwrite replaces them
    result = run_lmlab("data", "tokenize", "--tokenizer", other, "--corpus", corpus,
                       "--out", out, "--shard-tokens", 4096, "--overwrite")
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tokenizer"]["size"] == len(Tokenizer.from_pretrained(other))


def test_data_tokenize_into_a_folder_holding_other_files_is_refused(tmp_path, corpus,
                                                                    minilm_dir):
    out = tmp_path / "shards"
    out.mkdir()
    (out / "results.csv").write_text("a,b\n")
    before = disk_snapshot(out)
    result = run_lmlab_here("data", "tokenize", "--tokenizer", minilm_dir, "--corpus", corpus,
                       "--out", out)
    assert_clean_refusal(result, str(out), "results.csv", fix="--overwrite")
    assert disk_snapshot(out) == before


def test_data_tokenize_names_file_and_offset_of_a_bad_byte(tmp_path, corpus, minilm_dir):
    import shutil

    broken = tmp_path / "corpus"
    shutil.copytree(corpus, broken)
    train = broken / "train.jsonl"
    data = train.read_bytes()
    marker = b'"sentences": ["'
    offset = data.index(marker, data.index(b"\n")) + len(marker) + 5  # in document 2's text
    train.write_bytes(data[:offset] + b"\xe9" + data[offset + 1:])
    out = tmp_path / "shards"
    result = run_lmlab_here("data", "tokenize", "--tokenizer", minilm_dir, "--corpus", broken,
                       "--out", out)
    assert_clean_refusal(result, f"{train}: byte {offset} ", fix="--encoding-errors replace")
    assert "manifest.json" not in {p.name for p in out.glob("*")}
    result = run_lmlab("data", "tokenize", "--tokenizer", minilm_dir, "--corpus", broken,
                       "--out", out, "--encoding-errors", "replace")
    assert result.returncode == 0, result.stderr


# ----------------------------------------------------------------------------- data build

def test_data_build_into_a_folder_holding_something_is_refused(tmp_path, text_file):
    out = tmp_path / "corpus"
    out.mkdir()
    (out / "draft.txt").write_text("keep me\n")
    users = tmp_path / "mine"
    users.mkdir()
    (users / "a.txt").write_bytes(text_file.read_bytes())
    before = disk_snapshot(out)
    args = ("data", "build", "--sources", f"folder:{users}", "--out", out,
            "--exclude-tasks", "none")
    result = run_lmlab_here(*args)
    assert_clean_refusal(result, str(out), "draft.txt", fix="--overwrite")
    assert disk_snapshot(out) == before
    result = run_lmlab(*args, "--overwrite")
    assert result.returncode == 0, result.stderr
    assert (out / "draft.txt").read_text() == "keep me\n"
    assert (out / "manifest.json").is_file()


def test_data_build_names_file_and_offset_of_a_bad_byte(tmp_path, text_file):
    users = tmp_path / "mine"
    users.mkdir()
    good = text_file.read_bytes()
    (users / "latin1.txt").write_bytes(good + b"na\xefve\n")
    out = tmp_path / "corpus"
    args = ("data", "build", "--sources", f"folder:{users}", "--out", out,
            "--exclude-tasks", "none")
    result = run_lmlab_here(*args)
    assert_clean_refusal(result, f"{users / 'latin1.txt'}: byte {len(good) + 2} ",
                         fix="--encoding-errors replace")
    assert not (out / "manifest.json").exists()
    result = run_lmlab(*args, "--overwrite", "--encoding-errors", "replace")
    assert result.returncode == 0, result.stderr
    assert "na\ufffdve" in (out / "train.jsonl").read_text(encoding="utf-8") + \
        (out / "validation.jsonl").read_text(encoding="utf-8")


def test_data_build_with_a_jsonl_line_over_16m_characters_is_an_error(tmp_path):
    path = tmp_path / "big.jsonl"
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(json.dumps({"text": "A first short document."}) + "\n")
        handle.write('{"text": "' + "lorem ipsum dolor sit amet. " * 600_000 + '"}\n')
    out = tmp_path / "corpus"
    result = run_lmlab_here("data", "build", "--sources", f"jsonl:{path}", "--out", out,
                       "--exclude-tasks", "none")
    assert_clean_refusal(result, f"{path}:2 is longer than 16,000,000 characters",
                         fix="split that record")
    assert not (out / "manifest.json").exists()
