"""Bad input is refused before any work starts, by every command but the data ones
(tests/test_bad_input_data.py has those).

Each case runs ``lmlab ...`` through the CLI's ``main`` in this process (conftest's
``run_lmlab_here``, cwd = the test's own folder) and asserts: exit code 2, "lmlab: error:"
naming the problem, "lmlab: fix:", no traceback, and not one file or folder created, removed
or modified, in the working folder or in the shared workspace (token shards, a corpus, a
finished pretraining run). Validation happens before any
work, so a case costs milliseconds (plus loading a model where the command needs one to check
its input).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from conftest import (
    assert_clean_refusal,
    disk_snapshot,
    run_lmlab_here,
    write_kjv_corpus,
)

from lmlab.utils.errors import LmlabError


def assert_refused(args: list[str], cwd: Path, names: tuple[str, ...],
                   watched: tuple[Path, ...] = ()) -> str:
    """Run ``lmlab args``; assert a clean refusal whose error line contains every one of
    ``names`` and that nothing on disk changed. Returns stderr."""
    before = disk_snapshot(cwd, *watched)
    result = run_lmlab_here(*args, cwd=cwd)
    after = disk_snapshot(cwd, *watched)
    assert_clean_refusal(result, *names)
    changed = sorted(set(before) ^ set(after)
                     | {k for k in before.keys() & after.keys() if before[k] != after[k]})
    assert not changed, f"{args} changed files on disk: {changed[:5]}"
    return result.stderr


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, minilm_dir) -> dict[str, Path]:
    """Real inputs to point bad commands at: a KJV corpus, its MiniLM token shards, the same
    corpus sharded differently (another fingerprint), a finished 2-step pretraining run, a
    folder holding unrelated files, an existing text file."""
    from lmlab.cli import main
    from lmlab.data.shards import build_shards
    from lmlab.tokenization.tokenizer import Tokenizer

    root = tmp_path_factory.mktemp("workspace")
    corpus = write_kjv_corpus(root / "corpus", train=24, validation=6)
    tokenizer = Tokenizer.from_pretrained(minilm_dir)
    build_shards(tokenizer, corpus, root / "shards", shard_tokens=8192, show_progress=False)
    build_shards(tokenizer, corpus, root / "shards-other", shard_tokens=4096,
                 show_progress=False)
    run = root / "run"
    assert main(["pretrain", "--family", "bert", "--size", "tiny", "--objective", "mlm",
                 "--shards", str(root / "shards"), "--seq-len", "32", "--batch-size", "2",
                 "--lr", "1e-3", "--steps", "2", "--eval-batches", "1", "--out", str(run),
                 "--no-cost", "--precision", "fp32"]) == 0  # a module fixture: not pinned
    text = root / "notes.txt"
    text.write_text("In the beginning God created the heaven and the earth.\n")
    yaml_text = root / "text-lr.yaml"  # YAML 1.1 reads 1e-3 (no dot) as a string
    yaml_text.write_text("hparams:\n  lr: 1e-3\n")
    return {"root": root, "corpus": corpus, "shards": root / "shards",
            "shards_other": root / "shards-other", "run": run, "text": text,
            "yaml_text": yaml_text}


def _pretrain(ws: dict[str, Path], *extra: str, out: str = "r") -> list[str]:
    return ["pretrain", "--family", "bert", "--size", "tiny", "--shards", str(ws["shards"]),
            "--steps", "1", "--out", out, *extra]


def _resume(ws: dict[str, Path], *changes: str) -> list[str]:
    """The command that made ``ws["run"]``, with ``changes`` (flag, value) applied."""
    args = {"--family": "bert", "--size": "tiny", "--objective": "mlm",
            "--shards": str(ws["shards"]), "--seq-len": "32", "--batch-size": "2",
            "--lr": "1e-3", "--steps": "4", "--eval-batches": "1", "--out": str(ws["run"])}
    args.update(dict(zip(changes[::2], changes[1::2])))
    return ["pretrain", *itertools.chain.from_iterable(args.items()), "--no-cost"]


# (case id, argv builder from the workspace, words the error line must contain)
CASES = [
    # -- lmlab pretrain: names, paths, numbers --------------------------------------------------
    ("pretrain-family", lambda ws: _pretrain(ws, "--family", "bret"), ("bret",)),
    ("pretrain-size", lambda ws: _pretrain(ws, "--size", "huge"), ("huge",)),
    ("pretrain-objective", lambda ws: _pretrain(ws, "--objective", "mlm,sopp"), ("sopp",)),
    ("pretrain-shards-missing", lambda ws: _pretrain(ws, "--shards", "nowhere"),
     ("--shards", "nowhere", "does not exist")),
    ("pretrain-shards-not-shards", lambda ws: _pretrain(ws, "--shards", str(ws["corpus"])),
     ("token-shard folder", "manifest.json")),
    ("pretrain-seq-len", lambda ws: _pretrain(ws, "--seq-len", "4096"), ("4096", "512")),
    ("pretrain-batch-size", lambda ws: _pretrain(ws, "--batch-size", "0"), ("batch_size",)),
    ("pretrain-lr", lambda ws: _pretrain(ws, "--lr", "-1"), ("lr", "-1")),
    ("pretrain-budget", lambda ws: _pretrain(ws, "--budget", "soon"), ("soon",)),
    ("pretrain-warmup", lambda ws: _pretrain(ws, "--warmup", "abc"), ("warmup", "abc")),
    ("pretrain-no-end", lambda ws: [a for a in _pretrain(ws) if a not in ("--steps", "1")],
     ("no end",)),
    ("pretrain-steps", lambda ws: _pretrain(ws, "--steps", "0"), ("max_steps",)),
    ("pretrain-seed", lambda ws: _pretrain(ws, "--seed", "x"), ("--seed", "'x'")),
    ("pretrain-schedule", lambda ws: _pretrain(ws, "--schedule", "wobbly"), ("wobbly",)),
    ("pretrain-eval-batches", lambda ws: _pretrain(ws, "--eval-batches", "0"),
     ("--eval-batches",)),
    ("pretrain-init", lambda ws: _pretrain(ws, "--init", "nowhere"), ("--init", "nowhere")),
    ("pretrain-tokenizer", lambda ws: _pretrain(ws, "--tokenizer", "nowhere"),
     ("--tokenizer", "nowhere")),
    ("pretrain-config", lambda ws: _pretrain(ws, "--config", "none.yaml"), ("none.yaml",)),
    ("pretrain-config-text-number", lambda ws: _pretrain(ws, "--config", str(ws["yaml_text"])),
     ("lr must be a number", "'1e-3'")),
    ("pretrain-out-holds-files", lambda ws: _pretrain(ws, out=str(ws["corpus"])),
     ("already holds", "train.jsonl")),
    # -- resuming a run dir with other result-changing settings --------------------------------
    ("resume-objective", lambda ws: _resume(ws, "--objective", "mlm,sop"), ("objective",)),
    ("resume-size", lambda ws: _resume(ws, "--size", "mini"), ("size", "'tiny' -> 'mini'")),
    ("resume-shards", lambda ws: _resume(ws, "--shards", str(ws["shards_other"])),
     ("shards_fingerprint",)),
    ("resume-lr", lambda ws: _resume(ws, "--lr", "2e-3"), ("lr", "0.001 -> 0.002")),
    ("resume-family", lambda ws: _resume(ws, "--family", "roberta", "--size", "base"),
     ("family", "size")),
    # -- lmlab demo: checked before the data stages ---------------------------------------------
    ("demo-seeds", lambda ws: ["demo", "--seeds", "x", "--out", "d"], ("--seeds", "'x'")),
    ("demo-tasks", lambda ws: ["demo", "--tasks", "fortunes-topic,nope", "--out", "d"],
     ("--tasks", "'nope'")),
    ("demo-size", lambda ws: ["demo", "--size", "huge", "--out", "d"], ("huge",)),
    ("demo-objective", lambda ws: ["demo", "--objective", "mlmm", "--out", "d"], ("mlmm",)),
    ("demo-budget", lambda ws: ["demo", "--budget", "5s", "--out", "d"], ("too small",)),
    ("demo-sources", lambda ws: ["demo", "--sources", "nosuch", "--out", "d"], ("nosuch",)),
    ("demo-vocab-size", lambda ws: ["demo", "--vocab-size", "5", "--out", "d"],
     ("--vocab-size",)),
    ("demo-out-holds-files", lambda ws: ["demo", "--out", str(ws["corpus"])],
     ("already holds",)),
    # -- lmlab finetune / evaluate / baseline ---------------------------------------------------
    ("finetune-seeds", lambda ws: ["finetune", "--task", "fortunes-topic", "--model", "minilm",
                                   "--out", "f", "--seeds", "1,x"], ("--seeds", "'1,x'")),
    ("finetune-lr", lambda ws: ["finetune", "--task", "fortunes-topic", "--model", "minilm",
                                "--out", "f", "--lr", "0"], ("--lr",)),
    ("finetune-max-length", lambda ws: ["finetune", "--task", "fortunes-topic", "--model",
                                        "minilm", "--out", "f", "--max-length", "1000"],
     ("--max-length 1000", "512")),
    ("finetune-out-holds-files", lambda ws: ["finetune", "--task", "fortunes-topic", "--model",
                                             "minilm", "--out", str(ws["corpus"])],
     ("already holds",)),
    ("finetune-task", lambda ws: ["finetune", "--task", "nope", "--model", "minilm", "--out",
                                  "f"], ("'nope'",)),
    ("finetune-model", lambda ws: ["finetune", "--task", "fortunes-topic", "--model",
                                   "nowhere", "--out", "f"], ("nowhere",)),
    ("evaluate-split", lambda ws: ["evaluate", "--task", "fortunes-topic", "--model", "minilm",
                                   "--splits", "dev,nope"], ("'nope'",)),
    ("baseline-task", lambda ws: ["baseline", "--task", "nope", "--out", "b"], ("'nope'",)),
    ("baseline-out-holds-files", lambda ws: ["baseline", "--task", "fortunes-topic", "--out",
                                             str(ws["corpus"])], ("already holds",)),
    # -- generation ------------------------------------------------------------------------------
    ("generate-max-new-tokens", lambda ws: ["generate", "smollm2", "hi", "--max-new-tokens",
                                            "0"], ("max_new_tokens",)),
    ("generate-top-p", lambda ws: ["generate", "smollm2", "hi", "--top-p", "1.5"], ("top_p",)),
    ("generate-model", lambda ws: ["generate", "nowhere", "hi"], ("nowhere",)),
    ("chat-num-beams", lambda ws: ["chat", "smollm2", "--num-beams", "0"], ("num_beams",)),
    ("perplexity-file", lambda ws: ["perplexity", "smollm2", "none.txt"], ("none.txt",)),
    ("perplexity-stride", lambda ws: ["perplexity", "smollm2", str(ws["text"]),
                                      "--max-length", "64", "--stride", "128"],
     ("--stride 128",)),
    ("lm-eval-split", lambda ws: ["lm-eval", "--task", "fortunes-topic", "--model", "smollm2",
                                  "--split", "nope"], ("'nope'",)),
    ("lm-eval-corpus", lambda ws: ["lm-eval", "--task", "cloze", "--model", "smollm2",
                                   "--corpus", "nowhere"], ("--corpus", "nowhere")),
    # -- lmlab cost -----------------------------------------------------------------------------
    ("cost-model", lambda ws: ["cost", "estimate", "--model", "nope", "--tokens", "1e9"],
     ("'nope'",)),
    ("cost-tokens", lambda ws: ["cost", "estimate", "--model", "bert-base", "--tokens", "-5"],
     ("tokens",)),
    ("cost-tokens-text", lambda ws: ["cost", "estimate", "--model", "bert-base", "--tokens",
                                     "lots"], ("--tokens", "'lots'")),
    ("cost-peak", lambda ws: ["cost", "estimate", "--model", "bert-base", "--tokens", "1e9",
                              "--peak-tflops", "0"], ("peak",)),
    ("cost-power", lambda ws: ["cost", "estimate", "--model", "bert-base", "--tokens", "1e9",
                               "--power-watts", "-3"], ("power",)),
    ("cost-flops-seq-len", lambda ws: ["cost", "flops", "--model", "bert-base", "--seq-len",
                                       "0"], ("seq_len",)),
    # -- encoders: fill-mask, embed, neighbours -------------------------------------------------
    ("fill-mask-top-k", lambda ws: ["fill-mask", "minilm", "a [MASK]", "--top-k", "0"],
     ("--top-k",)),
    ("embed-layer", lambda ws: ["embed", "minilm", "a", "--layer", "deepest"], ("deepest",)),
    ("embed-out-exists", lambda ws: ["embed", "minilm", "a", "--out", str(ws["text"])],
     ("already exists",)),
    ("neighbours-corpus", lambda ws: ["neighbours", "minilm", "--corpus", "nowhere", "--word",
                                      "lamb", "a lamb"], ("--corpus", "nowhere")),
    ("neighbours-query", lambda ws: ["neighbours", "minilm", "--corpus", str(ws["corpus"]),
                                     "--word", "lamb", "a sheep"], ("'a sheep'", "'lamb'")),
    # -- runs show, tasks export-texts ----------------------------------------------------------
    ("runs-show", lambda ws: ["runs", "show", str(ws["corpus"])], ("not a run directory",)),
    ("export-task", lambda ws: ["tasks", "export-texts", "--task", "nope", "--out", "t.txt"],
     ("'nope'",)),
    ("export-splits", lambda ws: ["tasks", "export-texts", "--task", "wordnet-wic", "--splits",
                                  "dev,valid", "--out", "t.txt"], ("'valid'",)),
    ("export-out-exists", lambda ws: ["tasks", "export-texts", "--task", "wordnet-wic", "--out",
                                      str(ws["text"])], ("already exists",)),
]


@pytest.mark.parametrize("case,argv,names", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_before_any_work(case, argv, names, workspace, tmp_path):
    assert_refused(argv(workspace), tmp_path, names, watched=(workspace["root"],))


def test_there_are_at_least_thirty_cases():
    assert len(CASES) >= 30
    assert len({case for case, _, _ in CASES}) == len(CASES)


def test_overwrite_flag_is_named_in_the_fix(workspace, tmp_path):
    err = assert_refused(_pretrain(workspace, out=str(workspace["corpus"])), tmp_path,
                         ("already holds",), watched=(workspace["root"],))
    assert "--overwrite" in err
    err = assert_refused(_resume(workspace, "--objective", "span"), tmp_path, ("objective",),
                         watched=(workspace["root"],))
    assert "--overwrite" in err and str(workspace["run"]) in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_an_absent_gpu_is_refused_before_overwrite_removes_the_run(workspace, tmp_path):
    """``--device cuda`` on a machine without one: refused, with the run that ``--overwrite``
    would have started over left exactly as it was."""
    assert_refused(_resume(workspace, "--device", "cuda") + ["--overwrite"], tmp_path,
                   ("CUDA is not available",), watched=(workspace["root"],))


# -- the library raises the same errors (the CLI only calls it) ---------------------------------
def test_demo_config_validates_before_any_stage(tmp_path):
    from lmlab.demo.job import DemoConfig, run_demo

    out = tmp_path / "demo"
    with pytest.raises(LmlabError, match="'nope'"):
        run_demo(DemoConfig(out=str(out), tasks=("fortunes-topic", "nope")))
    with pytest.raises(LmlabError, match="--seeds"):
        DemoConfig(seeds=()).validate()
    with pytest.raises(LmlabError, match="too small"):
        DemoConfig(budget=10).validate()
    assert not out.exists()  # nothing was created
    DemoConfig().validate()  # the defaults are valid


def test_finetune_api_refuses_what_the_command_refuses(tmp_path):
    from lmlab.finetune.runner import finetune
    from lmlab.tasks.builtin import load_builtin_task

    task = load_builtin_task("fortunes-topic", "cpu")
    out = tmp_path / "run"
    for setting, value, option in (("lr", 0.0, "--lr"), ("epochs", 0, "--epochs"),
                                   ("batch_size", 0, "--batch-size"),
                                   ("max_length", 1, "--max-length"),
                                   ("budget_seconds", -1.0, "--budget")):
        with pytest.raises(LmlabError, match=option):
            finetune(task, "minilm", out, **{setting: value})
    assert not out.exists()


def test_training_config_ranges():
    from lmlab.training.config import TrainingConfig

    for field, value in (("batch_size", 0), ("seq_len", 0), ("workers", -1), ("threads", 0),
                         ("weight_decay", -0.1), ("clip_norm", 0.0), ("eval_every", 0),
                         ("save_every", 0), ("warmup_steps", -1), ("device", "tpu"),
                         ("seed", 1.5)):
        with pytest.raises(LmlabError, match=field if field != "device" else "tpu"):
            TrainingConfig(max_steps=1, **{field: value})
    TrainingConfig(max_steps=1, clip_norm=None, threads=None, workers=0, device="cuda:1")


def test_objective_spec_is_checked_without_building():
    from lmlab.objectives.registry import check_objective_spec

    assert check_objective_spec("mlm, sop") == ["mlm", "sop"]
    assert check_objective_spec("electra") == ["rtd"]
    for spec, words in (("mlm,xx", "'xx'"), ("", "empty"), ("mlm,mlm", "twice"),
                        ("span,sbo", "twice")):
        with pytest.raises(LmlabError, match=words):
            check_objective_spec(spec)


def test_check_helpers():
    from lmlab.utils.checks import parse_int_list

    assert parse_int_list(" 0, 1,2 ", "--seeds") == (0, 1, 2)
    for text, words in (("0,x", "whole numbers"), ("", "names no number"), ("1,1", "repeats"),
                        ("1.5", "whole numbers")):
        with pytest.raises(LmlabError, match=words):
            parse_int_list(text, "--seeds")


# -- resuming: every result-changing setting is compared -----------------------------------------
def _run_config(workspace) -> dict:
    return json.loads((workspace["run"] / "config.json").read_text())


def test_resume_accepts_the_same_settings_and_a_moved_shards_folder(workspace):
    from lmlab.training.run_dir import check_resumable

    config = _run_config(workspace)
    check_resumable(workspace["run"], config)
    moved = json.loads(json.dumps(config))
    moved["hparams"]["shards"] = "/elsewhere/shards"  # same fingerprint, another path
    moved["data"]["shards"] = "/elsewhere/shards"
    moved["hparams"]["max_steps"] = 10  # extending a run is allowed
    check_resumable(workspace["run"], moved)


@pytest.mark.parametrize("section,key,value", [
    ("hparams", "objective", "mlm,sop"), ("hparams", "family", "roberta"),
    ("hparams", "size", "mini"), ("hparams", "objective_args", {"mask_prob": 0.2}),
    ("hparams", "model_args", {"num_hidden_layers": 3}), ("hparams", "seed", 7),
    ("hparams", "batch_size", 64), ("hparams", "init", "minilm"),
    ("data", "tokenizer_fingerprint", "0" * 64), ("data", "shards_fingerprint", "f" * 16),
])
def test_resume_refuses_each_result_changing_setting(workspace, section, key, value):
    from lmlab.training.run_dir import check_resumable

    config = json.loads(json.dumps(_run_config(workspace)))
    config[section][key] = value
    with pytest.raises(LmlabError, match=key) as info:
        check_resumable(workspace["run"], config)
    assert "--overwrite" in info.value.fix


def test_the_run_records_both_fingerprints(workspace):
    from lmlab.training.run_dir import shards_fingerprint
    from lmlab.utils.io import read_json

    data = _run_config(workspace)["data"]
    assert data["shards_fingerprint"] == shards_fingerprint(
        read_json(workspace["shards"] / "manifest.json"))
    assert data["shards_fingerprint"] != shards_fingerprint(
        read_json(workspace["shards_other"] / "manifest.json"))
    assert len(data["tokenizer_fingerprint"]) == 64


def test_overwrite_starts_a_run_over_and_keeps_other_files(tmp_path, workspace):
    import shutil

    from lmlab.training.run_dir import RUN_OUTPUTS, prepare_run_folder

    run = tmp_path / "run"
    shutil.copytree(workspace["run"], run)
    (run / "my-notes.txt").write_text("keep me")
    config = json.loads((run / "config.json").read_text())
    config["hparams"]["objective"] = "span"
    with pytest.raises(LmlabError, match="objective"):
        prepare_run_folder(run, overwrite=False, config=config)
    assert (run / "checkpoints").is_dir()
    prepare_run_folder(run, overwrite=True, config=config)
    assert not any((run / name).exists() for name in RUN_OUTPUTS)
    assert (run / "my-notes.txt").read_text() == "keep me"


def test_devices_are_resolved_or_refused_with_the_fix(monkeypatch):
    """``resolve_device``: names torch cannot parse, device kinds lmlab does not run on, a GPU
    this machine lacks (CUDA absent, an index beyond the count, MPS absent) are refused with a
    fix; under torchrun a bare ``cuda`` is the process's own GPU (its LOCAL_RANK)."""
    import torch

    from lmlab.training import distributed
    from lmlab.training.distributed import resolve_device

    for name, words in (("cuda:x", "unknown device 'cuda:x'"), ("tpu", "unknown device"),
                        ("meta", "unknown device 'meta'")):
        with pytest.raises(LmlabError, match=words):
            resolve_device(name)
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(LmlabError, match="CUDA is not available"):
        resolve_device("cuda:0")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(LmlabError, match="MPS is not available"):
        resolve_device("mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(LmlabError, match="has 2 GPUs") as refusal:
        resolve_device("cuda:2")
    assert "cuda:0 to cuda:1" in str(refusal.value)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device("cuda") == torch.device("cuda")
    monkeypatch.setattr(distributed, "launched_by_torchrun", lambda: True)
    assert resolve_device("cuda", local_rank=1) == torch.device("cuda", 1)
    assert resolve_device("auto", local_rank=1) == torch.device("cuda", 1)
