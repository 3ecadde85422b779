"""Recurrent folders and runs saved before the recurrent softmax had its bias (commit 7c87b4d):
their logits were ``W h``, which a zero bias reproduces exactly, so they load with a zero bias
(they used to be refused with "missing heads.clm.decoder.bias ... check that config.json
belongs to these weights", a fix that does not apply)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from lmlab.interop.recurrent import build_model, load_recurrent, save_recurrent
from lmlab.models.rnn.config import recurrent_preset

HEAD = {"awd-lstm": "clm", "elmo": "bilm"}


def drop_bias(weights, head):
    """Rewrite ``weights`` as an old folder: no ``heads.<head>.decoder.bias``."""
    from safetensors import safe_open

    with safe_open(str(weights), "pt") as handle:
        metadata = handle.metadata()
    state = load_file(str(weights))
    del state[f"heads.{head}.decoder.bias"]
    save_file(state, str(weights), metadata=metadata)


@pytest.mark.parametrize("family", ["awd-lstm", "elmo"])
def test_an_old_folder_without_the_softmax_bias_loads_with_a_zero_bias(family, tmp_path):
    torch.manual_seed(0)
    head = HEAD[family]
    config = recurrent_preset(family, "tiny", vocab_size=50)
    if family == "elmo":
        table = torch.randint(0, 50, (50, config.max_chars))
        model = build_model(config, [head], char_table=table).eval()
    else:
        model = build_model(config, [head]).eval()
    save_recurrent(model, tmp_path / "old")
    drop_bias(tmp_path / "old" / "model.safetensors", head)
    with torch.no_grad():  # the old model: no bias, i.e. a zero one
        model.heads[head].decoder.bias.fill_(0.5)  # anything a random fill would give
    loaded = load_recurrent(tmp_path / "old")
    bias = loaded.heads[head].decoder.bias
    assert torch.equal(bias, torch.zeros_like(bias))  # exact: zeros
    assert torch.equal(loaded.state_dict()[f"heads.{head}.decoder.weight"],
                       model.state_dict()[f"heads.{head}.decoder.weight"])  # exact: loaded as saved
    assert json.loads((tmp_path / "old" / "config.json").read_text())["family"] == family


def test_a_folder_missing_other_weights_is_still_refused(tmp_path):
    from lmlab.utils.errors import LmlabError

    model = build_model(recurrent_preset("awd-lstm", "tiny", vocab_size=50), ["clm"])
    save_recurrent(model, tmp_path / "cut")
    weights = tmp_path / "cut" / "model.safetensors"
    state = load_file(str(weights))
    name = next(k for k in state if k.startswith("rnns.") or "lstm" in k)
    del state[name]
    save_file(state, str(weights))
    with pytest.raises(LmlabError, match="missing"):
        load_recurrent(tmp_path / "cut")


def test_init_from_an_old_unfinished_run_without_the_softmax_bias(tmp_path_factory, tmp_path):
    from conftest import kjv_shards
    from test_rnn_init import unfinished_run

    from lmlab.training.checkpoint import latest_checkpoint
    from lmlab.training.pretrain import load_init

    run = unfinished_run("awd-lstm", kjv_shards(tmp_path_factory, 6, 1), tmp_path / "cut")
    weights = latest_checkpoint(run / "checkpoints") / "model.safetensors"
    drop_bias(weights, "clm")
    model = load_init(run, 30522)
    bias = model.heads["clm"].decoder.bias
    assert torch.equal(bias, torch.zeros_like(bias))  # exact: zeros


def test_resuming_a_run_from_before_the_bias_names_the_way_out():
    """Exact resume is impossible (the optimizer state lacks the bias), so the refusal points
    to --init, which loads the old weights with a zero bias."""
    from lmlab.training.checkpoint import load_into
    from lmlab.utils.errors import LmlabError

    model = build_model(recurrent_preset("awd-lstm", "tiny", vocab_size=50), ["clm"])
    old = {k: v for k, v in model.state_dict().items() if k != "heads.clm.decoder.bias"}
    with pytest.raises(LmlabError, match="does not match the model") as refused:
        load_into(build_model(recurrent_preset("awd-lstm", "tiny", vocab_size=50), ["clm"]),
                  old, "step-2/model.safetensors")
    assert "--init RUN" in refused.value.fix
    with pytest.raises(LmlabError) as other:  # any other mismatch keeps the general advice
        load_into(model, {k: v for k, v in old.items() if "layers.0" not in k}, "x")
    assert "same model configuration" in other.value.fix
