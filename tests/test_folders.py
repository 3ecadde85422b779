"""The one table of folder kinds (lmlab/interop/folders.py) that the loader dispatches on."""

from __future__ import annotations

import json

import pytest

from lmlab.interop.folders import KINDS, folder_kind, load_model, plain_kind, source_kind
from lmlab.utils.errors import LmlabError


def folder(tmp_path, name: str, config: dict | None = None, *markers: str):
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config or {"model_type": "bert"}))
    for marker in markers:
        (path / marker).write_text("{}")
    return path


def test_each_kind_is_read_from_its_marker(tmp_path):
    assert folder_kind(tmp_path / "model.gguf") == "gguf"
    assert folder_kind(folder(tmp_path, "hf")) == "huggingface"
    assert folder_kind(folder(tmp_path, "native", {"lmlab_heads": []})) == "native"
    recurrent = folder(tmp_path, "rnn", {"lmlab_recurrent": 1, "family": "awd-lstm"})
    assert plain_kind(recurrent) == folder_kind(recurrent) == "recurrent"
    assert folder_kind(folder(tmp_path, "q", {"lmlab_heads": []}, "quantization.json")) == "quantized"
    assert folder_kind(folder(tmp_path, "a", None, "adapter.json")) == "adapter"
    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    (run / "model" / "adapter.json").write_text("{}")
    assert folder_kind(run) == "adapter"  # a run fine-tuned with --method: its model/ folder
    feature = folder(tmp_path, "f", {"lmlab_heads": []}, "feature_head.json")
    assert folder_kind(feature) == "feature-run" and plain_kind(feature) == "native"
    assert source_kind(tmp_path / "missing") is None
    seen = {folder_kind(p) for p in [tmp_path / "model.gguf", *tmp_path.iterdir()]}
    assert seen == set(KINDS)  # every kind the table names is read from a marker


def test_the_plain_loader_refuses_a_wrapped_folder_with_the_loader_that_reads_it(tmp_path):
    quantized = folder(tmp_path, "q", {"lmlab_heads": []}, "quantization.json")
    with pytest.raises(LmlabError, match="quantized folder") as error:
        load_model(quantized)
    assert "lmlab.from_pretrained" in error.value.fix
