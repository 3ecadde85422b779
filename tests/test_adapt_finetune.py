"""``lmlab finetune --method``: the run trains the method's parameters only, its model/ holds
the small adapter file (no full checkpoint), ``lmlab evaluate`` and ``load_model`` read it on
top of the base model, and bad combinations are refused before any work."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_clean_refusal, assert_close_rounding, run_lmlab_here
from test_finetune import toy_task

import lmlab
from lmlab.finetune.runner import evaluate, finetune, load_model
from lmlab.utils.errors import LmlabError


@pytest.mark.parametrize("method", ["lora", "prefix"])
def test_finetune_with_a_method_writes_an_adapter(tiny_bert_folder, tmp_path, method):
    options = {"r": 4, "targets": ("q_proj", "v_proj", "up_proj")} if method == "lora" \
        else {"num_virtual_tokens": 4}
    lr = 1e-2 if method == "lora" else None  # prefix: the method's default
    result = finetune(toy_task(), tiny_bert_folder, tmp_path / "run", epochs=6 if lr else 1,
                      batch_size=16, pooling="mean", show_progress=False, method=method,
                      method_options=options, min_updates=0, lr=lr, patience=5)
    model_dir = tmp_path / "run" / "model"
    assert (model_dir / "adapter.json").exists() and (model_dir / "tokenizer.json").exists()
    assert not (model_dir / "model.safetensors").exists()
    config = json.loads((model_dir / "adapter.json").read_text())
    assert config["method"] == method and config["base_model"] == str(tiny_bert_folder.resolve())
    assert result["method"]["name"] == method
    if method == "lora":
        assert result["dev"]["accuracy"] >= 0.9  # it learns the task
    else:
        assert result["recipe"]["lr"] == 1e-2  # the method's default
    full = sum(p.numel() for p in load_model(tiny_bert_folder)[0].parameters())
    assert 0 < result["trainable_parameters"] < 0.05 * full
    # only the method's tensors and the head changed; the base is intact
    model, _, _ = load_model(tmp_path / "run")
    base, _, _ = load_model(tiny_bert_folder)
    base_state = base.state_dict()
    for name, tensor in model.state_dict().items():
        if name in base_state:
            assert torch.equal(tensor, base_state[name]), name  # exact: saved, not trained
    again = evaluate(toy_task(), tmp_path / "run", None, ("dev",))
    assert again["dev"] == result["dev"]  # the best epoch's adapter was saved and reloaded
    assert lmlab.from_pretrained(tmp_path / "run").adaptation.method == method
    for again_method in (None, method):  # the adapter alone would train, then be dropped
        with pytest.raises(LmlabError, match="parameter-efficient run's adapter"):
            finetune(toy_task(), model_dir, tmp_path / "again", method=again_method,
                     show_progress=False)
        assert not (tmp_path / "again").exists()


def test_bad_method_settings_are_refused(tiny_bert_folder, tmp_path):
    task = toy_task(16, 6)
    with pytest.raises(LmlabError, match="unknown lora option"):
        finetune(task, tiny_bert_folder, tmp_path / "a", method="lora",
                 method_options={"rank": 2}, show_progress=False)
    with pytest.raises(LmlabError, match="the feature recipe"):
        finetune(task, tiny_bert_folder, tmp_path / "b", method="lora", recipe="feature",
                 show_progress=False)
    with pytest.raises(LmlabError, match="a random one would stay random"):
        finetune(task, tiny_bert_folder, tmp_path / "c", method="bitfit", random_init=True,
                 show_progress=False)
    assert not any((tmp_path / name).exists() for name in "abc")


def test_cli_method_options_refused_before_work(tiny_bert_folder, tmp_path):
    common = ["finetune", "--task", "wordnet-supersense", "--model", tiny_bert_folder,
              "--out", tmp_path / "run"]
    assert_clean_refusal(run_lmlab_here(*common, "--lora-r", "4"),
                         "--lora-r is an option of --method lora", fix="--method")
    assert_clean_refusal(run_lmlab_here(*common, "--method", "adapter", "--lora-r", "4"),
                         "--lora-r is an option of --method lora")
    assert_clean_refusal(run_lmlab_here(*common, "--method", "lora", "--lora-targets", "query"),
                         "unknown LoRA target")
    assert not (tmp_path / "run").exists()


def test_cli_adapter_merge_and_peft_round_trip(tiny_bert_folder, tmp_path):
    """``lmlab adapter merge`` writes a plain model with the adapter's outputs; ``to-peft`` then
    ``from-peft`` gives back an lmlab adapter with the same outputs."""
    from lmlab.adapt import apply_method, save_adapter
    from lmlab.cli import main
    from lmlab.models.task_heads import add_task_head

    model, tokenizer, _ = load_model(tiny_bert_folder)
    add_task_head(model, "sequence-classification", 2, {0: "no", 1: "yes"}, "cls")
    apply_method(model, "lora", r=2, targets=("q_proj", "o_proj"))
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.normal_(std=0.1)
    save_adapter(model, tmp_path / "adapter", base_model=tiny_bert_folder)
    batch = {"input_ids": torch.tensor([[101, 2023, 2003, 102]]),
             "attention_mask": torch.ones(1, 4, dtype=torch.long)}
    expected = model.eval()(**batch).logits

    assert main(["adapter", "merge", str(tmp_path / "adapter"), "--out",
                 str(tmp_path / "merged")]) == 0
    merged, _, _ = load_model(tmp_path / "merged")
    assert not any("lora" in n for n, _ in merged.named_parameters())
    # W + BA in one matrix against W x + B (A x): the same logits up to the rounding of two
    # layers and the head (widths 32 and 64)
    assert_close_rounding(merged(**batch).logits, expected, terms=64, depth=3)
    assert (tmp_path / "merged" / "tokenizer.json").exists()

    for action, source, out in (("to-peft", "adapter", "peft"), ("from-peft", "peft", "back")):
        assert main(["adapter", action, str(tmp_path / source), "--out",
                     str(tmp_path / out)]) == 0
    assert (tmp_path / "peft" / "adapter_model.safetensors").exists()
    back, _, _ = load_model(tmp_path / "back")
    assert torch.equal(back(**batch).logits, expected)  # exact: the same adapter, same ops
    assert main(["adapter", "merge", str(tmp_path / "adapter"), "--out",
                 str(tmp_path / "merged")]) == 2  # refused: --out holds the merged model
    assert_clean_refusal(run_lmlab_here("adapter", "from-peft", tmp_path / "adapter", "--out",
                                   tmp_path / "x"), "is not a PEFT folder")
    assert not (tmp_path / "x").exists()
