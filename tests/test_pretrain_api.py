"""``lmlab.pretrain(PretrainConfig(...))``, the library entry point that ``lmlab pretrain``, the
demo and the benchmarks call: the same run as the command, config files mapped onto its
sections, resume refusals naming the differing field, and no library module reaching into the
CLI."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from conftest import disk_snapshot, kjv_shards

import lmlab
from lmlab import LmlabError, PretrainConfig
from lmlab.training import TrainingConfig
from lmlab.training.metrics_log import read_metrics
from lmlab.training.pretrain import DataSettings, ModelSettings, ObjectiveSettings

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return kjv_shards(tmp_path_factory, train=24, validation=6)


def tiny_config(out: Path, shards: Path, **changes) -> PretrainConfig:
    """A 3-step bert-tiny MLM run: ``lmlab pretrain`` with the flags of the first test."""
    training = TrainingConfig(**{"seq_len": 32, "batch_size": 2, "lr": 1e-3, "max_steps": 3,
                                 "log_every": 1, "eval_every": 3, "seed": 0,
                                 **changes.pop("training", {})})
    values = {"out": out, "training": training, "model": ModelSettings("bert", "tiny"),
              "objective": ObjectiveSettings("mlm"), "data": DataSettings(shards, None, 1),
              "track_cost": False, **changes}
    return PretrainConfig(**values)


def losses(run: Path) -> list[tuple[str, int, float]]:
    return [(r["kind"], r["step"], r.get("loss", r.get("eval_loss")))
            for r in read_metrics(run / "metrics.jsonl") if r["kind"] in ("train", "eval")]


def test_library_run_equals_the_command(shards, tmp_path):
    from lmlab.cli import main

    assert main(["pretrain", "--family", "bert", "--size", "tiny", "--objective", "mlm",
                 "--shards", str(shards), "--seq-len", "32", "--batch-size", "2", "--lr",
                 "1e-3", "--steps", "3", "--log-every", "1", "--eval-every", "3",
                 "--eval-batches", "1", "--seed", "0", "--out", str(tmp_path / "cli"),
                 "--no-cost"]) == 0
    result = lmlab.pretrain(tiny_config(tmp_path / "api", shards))
    assert result.step == 3 and result.stop_reason and result.last_eval
    assert len(losses(tmp_path / "api")) == 4  # 3 train records and one evaluation
    assert losses(tmp_path / "api") == losses(tmp_path / "cli")
    cli_config = json.loads((tmp_path / "cli" / "config.json").read_text())
    api_config = json.loads((tmp_path / "api" / "config.json").read_text())
    assert api_config["hparams"] == cli_config["hparams"]
    assert api_config["model"] == cli_config["model"]
    assert lmlab.from_pretrained(tmp_path / "api" / "model").config.num_hidden_layers == 2


def test_config_file_round_trip(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("hparams:\n  family: bert\n  size: tiny\n  objective: mlm,sop\n"
                    "  objective_args: {mask_prob: 0.2}\n  model_args: {hidden_dropout_prob: 0.0}\n"
                    "  shards: shards/\n  warmup: 0.06\n  budget_seconds: 10m\n  max_tokens: 5M\n"
                    "speed:\n  threads: 2\ncost:\n  grid_g_per_kwh: 50\n")
    config = PretrainConfig.from_file(path, out="runs/x", lr=2e-3, precision="bf16",
                                      tokenizer="minilm", seed=None)
    assert config.model == ModelSettings("bert", "tiny", None, {"hidden_dropout_prob": 0.0})
    assert config.objective == ObjectiveSettings("mlm,sop", {"mask_prob": 0.2})
    assert config.data == DataSettings("shards/", "minilm", 8)
    training = config.training
    assert (training.warmup_fraction, training.budget_seconds, training.max_tokens) == \
        (0.06, 600.0, 5_000_000)
    assert (training.lr, training.precision, training.threads, training.seed) == \
        (2e-3, "bf16", 2, 0)  # overrides go to their sections; None ones are not given
    assert config.cost.grid_g_per_kwh == 50 and config.cost.price_per_hour is None
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps(config.to_sections()))
    assert PretrainConfig.from_file(saved, out="runs/x", tokenizer="minilm") == config


@pytest.mark.parametrize("sections,overrides,problem", [
    ({"hparams": {"famliy": "bert"}}, {}, "famliy"),
    ({"speed": {"family": "bert"}}, {}, "family"),
    ({"hparams": {"precision": "bf16"}}, {}, "speed setting"),
    ({}, {"bogus": 1}, "bogus"),
    ({}, {"warmup": "soon"}, "warmup"),
    ({"cost": {"price_per_hour": -1}}, {}, "price_per_hour"),
    ({"hparams": {"objective_args": [1]}}, {}, "objective_args"),
])
def test_config_refuses_bad_settings(sections, overrides, problem):
    values = {"out": "runs/x", "max_steps": 1, **overrides}
    with pytest.raises(LmlabError, match=problem):
        PretrainConfig.from_sections(sections, **values)


def test_bad_input_is_refused_before_any_work(shards, tmp_path):
    out = tmp_path / "run"
    for changes, problem in (({"training": {"seq_len": 4096}}, "512 positions"),
                             ({"model": ModelSettings("bert", "huge")}, "huge"),
                             ({"model": ModelSettings("vit", "tiny")}, "reads images"),
                             ({"model": ModelSettings("canine", "small")},
                              "objective canine-c"),  # mlm over 1.1M codepoints: refused
                             ({"objective": ObjectiveSettings("mlm,sopp")}, "sopp"),
                             ({"data": DataSettings(tmp_path / "none")}, "does not exist"),
                             ({"out": ""}, "no run directory")):
        with pytest.raises(LmlabError, match=problem):
            lmlab.pretrain(tiny_config(changes.pop("out", out), shards, **changes))
    assert not out.exists()


@pytest.fixture(scope="module")
def finished_run(shards, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("resume") / "run"
    lmlab.pretrain(tiny_config(out, shards, training={"max_steps": 2}))
    return out


@pytest.mark.parametrize("changes,field", [
    ({"objective": ObjectiveSettings("mlm", {"mask_prob": 0.2})}, "objective_args"),
    ({"objective": ObjectiveSettings("mlm,sop")}, "objective"),
    ({"model": ModelSettings("bert", "mini")}, "size: 'tiny' -> 'mini'"),
    ({"model": ModelSettings("bert", "tiny", model_args={"hidden_dropout_prob": 0.0})},
     "model_args"),
    ({"data": DataSettings(None, None, 2)}, "eval_batches: 1 -> 2"),
    ({"training": {"lr": 2e-3}}, "lr: 0.001 -> 0.002"),
    ({"other_shards": True}, "shards_fingerprint"),
])
def test_resume_refuses_each_changed_setting_naming_it(finished_run, shards, tmp_path_factory,
                                                       changes, field):
    if changes.pop("other_shards", False):  # the same corpus sharded otherwise
        changes["data"] = DataSettings(kjv_shards(tmp_path_factory, 20, 6), None, 1)
    elif "data" in changes:
        changes["data"].shards = shards
    before = disk_snapshot(finished_run)
    with pytest.raises(LmlabError, match="other settings") as error:
        changes["training"] = {"max_steps": 4, **changes.get("training", {})}
        lmlab.pretrain(tiny_config(finished_run, shards, **changes))
    assert field in error.value.problem
    assert disk_snapshot(finished_run) == before  # refused before any work


def test_resume_with_the_same_settings_extends_the_run(finished_run, shards):
    result = lmlab.pretrain(tiny_config(finished_run, shards, training={"max_steps": 3}))
    assert result.step == 3
    assert [r["step"] for r in read_metrics(finished_run / "metrics.jsonl")
            if r["kind"] == "train"] == [1, 2, 3]


def test_exports():
    from lmlab.training import PretrainConfig as FromTraining
    from lmlab.training.pretrain import pretrain

    assert lmlab.PretrainConfig is FromTraining and lmlab.pretrain is pretrain


def test_nothing_outside_the_cli_imports_it():
    """The library (and the benchmarks) never import ``lmlab.cli``: the CLI is a shell over the
    library. ``lmlab/__main__.py`` is the command's own entry point (``python -m lmlab``)."""
    offenders = []
    for path in [*(ROOT / "lmlab").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]:
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith("lmlab/cli/") or relative == "lmlab/__main__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
                     if isinstance(node, ast.ImportFrom) else [])
            if any(name == "lmlab.cli" or name.startswith("lmlab.cli.") for name in names):
                offenders.append(f"{relative}:{node.lineno}")
    assert not offenders, f"imports of lmlab.cli outside lmlab/cli/: {offenders}"
