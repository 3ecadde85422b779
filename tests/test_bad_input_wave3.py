"""Bad input that used to reach a traceback or a silent wrong result (issue #29, third wave):
refused before any work with an ``lmlab: error:`` and an ``lmlab: fix:`` line, exit code 2,
and nothing on disk created, changed or removed; the library raises the same LmlabError.

Each CLI case runs ``lmlab ...`` through the CLI's ``main`` in this process (conftest's
``run_lmlab_here``) on tiny real inputs (a 16-position GPT-2 with a BPE tokenizer trained on the
spot, a few-line task file): the refusal comes before any training or decoding.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import assert_clean_refusal, disk_snapshot, run_lmlab, run_lmlab_here

import lmlab
from lmlab.utils.errors import LmlabError


def assert_refused(args: list[object], cwd: Path, names: tuple[str, ...], fix: str = "",
                   watched: tuple[Path, ...] = ()) -> str:
    """Run ``lmlab args`` in ``cwd``: a clean refusal whose error line holds every one of
    ``names`` (and whose fix holds ``fix``), with ``cwd`` and ``watched`` unchanged on disk.
    Returns stderr."""
    before = disk_snapshot(cwd, *watched)
    result = run_lmlab_here(*args, cwd=cwd)
    assert_clean_refusal(result, *names, fix=fix)
    assert disk_snapshot(cwd, *watched) == before, f"{args} changed files on disk"
    return result.stderr


# -- a prompt longer than the model's positions --------------------------------------------------
CONTEXT = 16
LONG_PROMPT = "the cat sat on the mat the cat sat on the mat the cat sat on the mat"  # 18 tokens


def tiny_decoder(family: str, vocab: int) -> torch.nn.Module:
    """A random 2-layer decoder with a 16-position context (GPT-2: a learned table; Llama:
    rotary positions, trained for 16)."""
    from lmlab.models.model import LanguageModel
    from lmlab.models.presets import family_config

    torch.manual_seed(0)
    extra = dict(num_key_value_heads=2) if family == "llama" else {}
    config = family_config(family, vocab_size=vocab, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=4, intermediate_size=64,
                           max_position_embeddings=CONTEXT, **extra)
    return LanguageModel(config, heads=("clm",)).eval()


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """(folder, model, tokenizer): the tiny GPT-2 saved with a byte-level BPE trained on a few
    sentences, as ``lmlab generate`` loads a model folder."""
    from lmlab.tokenization.tokenizer import Tokenizer

    texts = ["the cat sat on the mat", "a dog ran in the park", "the sun is bright"] * 20
    tokenizer = Tokenizer.train(texts, kind="bpe", vocab_size=300, template="gpt2",
                                min_frequency=1)
    model = tiny_decoder("gpt2", len(tokenizer))
    folder = tmp_path_factory.mktemp("gpt2")
    lmlab.save_pretrained(model, folder)
    tokenizer.save_pretrained(folder)
    assert len(tokenizer.encode(LONG_PROMPT)) == 18
    return folder, model, tokenizer


@pytest.mark.parametrize("prompt,new,names,fix", [
    (LONG_PROMPT, 3, ("18 tokens", "21 positions", "context of 16"), "--truncate left"),
    ("the cat sat on the mat", 30, ("6 tokens", "max_new_tokens=30", "context of 16"),
     "at most 10 new tokens"),
], ids=["prompt-too-long", "prompt-plus-new-tokens-too-long"])
def test_generate_refuses_what_the_context_cannot_hold(gpt2, tmp_path, prompt, new, names, fix):
    """Used to stream part of the text, then die with torch's IndexError in the position
    table."""
    for stream in ([], ["--no-stream"]):
        err = assert_refused(["generate", gpt2[0], prompt, "--max-new-tokens", new, *stream],
                             tmp_path, names, fix=fix, watched=(gpt2[0],))
        assert "IndexError" not in err


def test_generate_truncate_left_keeps_the_end_of_the_prompt(gpt2, tmp_path):
    result = run_lmlab("generate", gpt2[0], LONG_PROMPT, "--max-new-tokens", 3,
                       "--truncate", "left", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "18 tokens" in result.stderr and "kept its last 13" in result.stderr
    assert result.stdout.startswith(LONG_PROMPT)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_generation_library_checks_the_context(gpt2, family):
    """``generate`` (token ids) refuses before decoding, learned or rotary positions alike;
    ``generate_text(truncate="left")`` keeps the prompt's last tokens and warns: its output is
    the output of the cut prompt."""
    from lmlab.generation.generate import generate, generate_text

    tokenizer = gpt2[2]
    model = tiny_decoder(family, len(tokenizer))
    ids = torch.tensor([tokenizer.encode(LONG_PROMPT)])
    with pytest.raises(LmlabError, match="18 tokens.*context of 16") as refusal:
        generate(model, ids, max_new_tokens=3)
    assert "truncate='left'" in refusal.value.fix
    left_padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), ids[:, :12]], dim=1)
    mask = torch.tensor([[0] * 4 + [1] * 12])
    assert generate(model, left_padded, mask, max_new_tokens=4).shape == (1, 20)  # 12 real + 4
    with pytest.raises(LmlabError, match="12 tokens"):
        generate(model, left_padded, mask, max_new_tokens=5)
    with pytest.warns(UserWarning, match="18 tokens.*kept its last 13"):
        cut = generate_text(model, tokenizer, LONG_PROMPT, max_new_tokens=3, truncate="left")
    expected = generate(model, ids[:, -13:], max_new_tokens=3)
    assert cut == [tokenizer.decode(expected[0, 13:].tolist(), skip_special_tokens=True)]
    with pytest.raises(LmlabError, match="truncate='right'"):
        generate_text(model, tokenizer, LONG_PROMPT, truncate="right")


# -- task files: an empty label, bytes that are not UTF-8 -----------------------------------------
DEV_CSV = "text,label\nthe cat sleeps by the fire,animal\nthe fern grows in the shade,plant\n"


def test_an_empty_label_cell_is_refused_naming_file_and_line(tmp_path):
    """Used to train a class named "" without a word."""
    (tmp_path / "train.csv").write_text("text,label\nthe lamb is gentle,animal\n"
                                        "the rose is red,\nthe oak is tall,plant\n")
    (tmp_path / "dev.csv").write_text(DEV_CSV)
    assert_refused(["baseline", "--task", "mine", "--train", "train.csv", "--dev", "dev.csv",
                    "--out", "b"], tmp_path, ("train.csv, line 3", "label", "is empty"),
                   fix="give the row its label")


@pytest.mark.parametrize("suffix,row", [(".tsv", "a text\t  \n"),
                                        (".jsonl", '{"text": "a text", "label": ""}\n')])
def test_library_refuses_an_empty_label_in_every_table_format(tmp_path, suffix, row):
    from lmlab.tasks.readers import load_table_task

    header = "text\tlabel\n" if suffix == ".tsv" else ""
    good = "a\tb\n" if suffix == ".tsv" else '{"text": "a", "label": "b"}\n'
    (tmp_path / f"train{suffix}").write_text(header + good + row)
    with pytest.raises(LmlabError, match=f"train{suffix}, line {3 if header else 2}: the "
                                         "label .* is empty"):
        load_table_task("t", {"train": tmp_path / f"train{suffix}"}, "text", "label")


def test_a_gzip_task_file_is_refused_naming_the_byte(tmp_path):
    """Used to end in a UnicodeDecodeError naming neither the file nor where in it."""
    import gzip

    (tmp_path / "train.csv").write_bytes(gzip.compress(DEV_CSV.encode()))
    (tmp_path / "dev.csv").write_text(DEV_CSV)
    assert_refused(["baseline", "--task", "mine", "--train", "train.csv", "--dev", "dev.csv",
                    "--out", "b"], tmp_path, ("train.csv: byte 1 (0x8b) is not UTF-8", "gzip"),
                   fix="zcat train.csv")


@pytest.mark.parametrize("task_type,name,text", [
    ("classification", "dev.jsonl", '{"text": "x", "label": "a"}\n{"text": "caf\xe9", '),
    ("tagging", "dev.conll", "The DT\ncaf\xe9 NN\n"),
    ("qa", "dev.json", '{"data": [{"title": "caf\xe9"}]}'),
])
def test_every_task_reader_names_file_and_offset_of_a_bad_byte(tmp_path, task_type, name, text):
    """Latin-1 bytes in a JSON-lines, CoNLL or SQuAD file: the offset is the file's own."""
    from lmlab.tasks.loader import load_task

    path = tmp_path / name
    path.write_bytes(text.encode("latin-1"))
    offset = text.index("\xe9")
    with pytest.raises(LmlabError, match=rf"{name}: byte {offset} \(0xe9\) is not UTF-8") as info:
        load_task("mine", train=path, dev=path, task_type=task_type)
    assert "iconv" in info.value.fix


# -- float settings that are not finite ------------------------------------------------------------
@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    from conftest import kjv_shards

    return kjv_shards(tmp_path_factory, train=8, validation=2)


@pytest.mark.parametrize("flag,value,names", [
    ("--lr", "nan", ("lr must be a finite number", "nan")),
    ("--lr", "inf", ("lr must be a finite number", "inf")),  # used to train to a NaN loss
    ("--weight-decay", "inf", ("weight_decay", "inf")),
    ("--clip-norm", "nan", ("clip_norm", "nan")),
    ("--warmup", "nan", ("--warmup", "nan")),  # used to fail converting NaN to a step count
    ("--warmup", "inf", ("--warmup", "inf")),
])
def test_pretrain_refuses_a_float_setting_that_is_not_finite(shards, tmp_path, flag, value,
                                                             names):
    """Used to reach torch's ValueError after the run's tokenizer was written, so that the
    rerun with a good value was refused until --overwrite: now nothing is written."""
    assert_refused(["pretrain", "--family", "bert", "--size", "tiny", "--shards", shards,
                    "--steps", "1", "--out", "run", "--no-cost", "--precision", "fp32", flag,
                    value], tmp_path, names, watched=(shards,))
    assert not (tmp_path / "run").exists()


def test_training_config_and_checks_refuse_nan_and_inf():
    from lmlab.training.config import TrainingConfig
    from lmlab.utils.checks import check_at_least, check_positive

    nan, inf = float("nan"), float("inf")
    for field, value in (("lr", nan), ("lr", inf), ("weight_decay", nan), ("eps", inf),
                         ("clip_norm", inf), ("budget_seconds", inf), ("warmup_fraction", nan),
                         ("min_lr_ratio", nan), ("ratio", nan), ("betas", (0.9, nan)),
                         ("betas", (0.9, 1.0)), ("eps", -1.0)):
        with pytest.raises(LmlabError, match=field):
            TrainingConfig(max_steps=1, **{field: value})
    for check, value in ((check_positive, inf), (check_positive, nan), (check_at_least, nan)):
        with pytest.raises(LmlabError, match="--lr must be a finite number"):
            check(value, *([0, "--lr"] if check is check_at_least else ["--lr"]))
    TrainingConfig(max_steps=1, betas=(0.0, 0.95), eps=0.0)


# -- generation options out of range, or sampling options without --sample ----------------------
@pytest.mark.parametrize("options,names", [
    (["--temperature", "-1"], ("temperature=-1.0", "positive")),
    (["--temperature", "-1", "--sample"], ("temperature=-1.0", "positive")),
    (["--temperature", "nan", "--sample"], ("temperature=nan",)),
    (["--temperature", "0.7"], ("sampling options (temperature=0.7)", "greedy")),
    (["--top-k", "5", "--top-p", "0.9"], ("top_k=5, top_p=0.9", "greedy")),
    (["--repetition-penalty", "inf"], ("repetition_penalty=inf",)),
    (["--length-penalty", "nan", "--num-beams", "2"], ("length_penalty=nan",)),
], ids=["temperature-negative", "temperature-negative-sampling", "temperature-nan",
        "temperature-greedy", "top-k-top-p-greedy", "repetition-penalty-inf",
        "length-penalty-nan"])
def test_generate_refuses_bad_or_ignored_sampling_options(gpt2, tmp_path, options, names):
    """``--temperature -1`` (or 0.7) without ``--sample`` used to be accepted and ignored."""
    err = assert_refused(["generate", gpt2[0], "the cat", "--max-new-tokens", "3", *options],
                         tmp_path, names, watched=(gpt2[0],))
    if "greedy" in names:
        assert "--sample" in err.split("lmlab: fix:")[1]


def test_generation_config_refuses_the_same_in_the_library(gpt2):
    from lmlab.generation.generate import GenerationConfig, generate_text

    model, tokenizer = gpt2[1], gpt2[2]
    for options, words in (({"temperature": 0.0, "do_sample": True}, "temperature=0.0"),
                           ({"temperature": float("inf"), "do_sample": True}, "temperature=inf"),
                           ({"temperature": 0.5}, "without sampling"),
                           ({"top_k": 3, "num_beams": 2}, "without sampling")):
        with pytest.raises(LmlabError, match=words):
            GenerationConfig(**options).validate()
        with pytest.raises(LmlabError, match=words):
            generate_text(model, tokenizer, "the cat", max_new_tokens=2, **options)
    GenerationConfig(do_sample=True, temperature=0.5, top_k=3, top_p=0.9).validate()


# -- a config.json that does not belong to its weights ---------------------------------------------
def _edited_copy(folder: Path, to: Path, **changes) -> Path:
    """A copy of a Hugging Face folder with ``changes`` made to its config.json."""
    import json
    import shutil

    shutil.copytree(folder, to)
    config = json.loads((to / "config.json").read_text())
    (to / "config.json").write_text(json.dumps({**config, **changes}))
    return to


def test_a_hidden_size_that_disagrees_with_the_weights_names_the_tensor(tiny_bert_folder,
                                                                        tmp_path):
    """hidden_size 30 against weights of width 32 used to read "hidden_size 30 is not
    divisible by num_attention_heads 4", which sends the user after the head count."""
    bad = _edited_copy(tiny_bert_folder, tmp_path / "bert", hidden_size=30)
    err = assert_refused(["embed", bad, "a lamb"], tmp_path,
                         ("hidden_size 30", "embeddings.word_embeddings.weight",
                          "30522 x 32", "expected 30522 x 30"), fix="hidden_size 32")
    assert "divisible" not in err


@pytest.mark.parametrize("changes,words", [
    ({"hidden_size": 48}, "hidden_size 48, but the weights' embeddings.word_embeddings.weight "
                          "is 30522 x 32"),
    ({"vocab_size": 30000}, "vocab_size 30000 and hidden_size 32, but .* is 30522 x 32"),
])
def test_from_pretrained_checks_the_sizes_before_building(tiny_bert_folder, tmp_path, changes,
                                                          words):
    import lmlab

    bad = _edited_copy(tiny_bert_folder, tmp_path / "bert", **changes)
    with pytest.raises(LmlabError, match=words):
        lmlab.from_pretrained(bad)
    assert lmlab.from_pretrained(tiny_bert_folder).config.hidden_size == 32


# -- lmlab data build from sources that hold no text ----------------------------------------------
def test_data_build_from_empty_files_is_refused_before_creating_anything(tmp_path):
    """Used to leave an empty corpus folder behind."""
    texts = tmp_path / "texts"
    texts.mkdir()
    for name in ("a.txt", "b.md"):
        (texts / name).write_text("")
    assert_refused(["data", "build", "--sources", "folder:texts", "--exclude-tasks", "none",
                    "--out", "corpus"], tmp_path,
                   ("folder:texts", "holds no text", "2 file(s) are empty"))
    (texts / "a.txt").unlink()
    (texts / "b.md").rename(texts / "b.csv")  # no .txt or .md file at all
    assert_refused(["data", "build", "--sources", "folder:texts", "--exclude-tasks", "none",
                    "--out", "corpus"], tmp_path, ("holds no .txt or .md files",))


def test_data_build_that_finds_no_text_leaves_no_folder_behind(tmp_path):
    """Files of blank lines pass the size check; the build finds the corpus empty and removes
    the folders it created for it (``--out`` and its new parents): the same paths with the
    same contents afterwards (the working folder's time moved)."""
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "blank.txt").write_text("\n\n   \n")
    before = disk_snapshot(tmp_path, times=False)
    result = run_lmlab_here("data", "build", "--sources", "folder:texts", "--exclude-tasks", "none",
                       "--out", "runs/corpus", cwd=tmp_path)
    assert_clean_refusal(result, "the corpus is empty")
    assert disk_snapshot(tmp_path, times=False) == before
