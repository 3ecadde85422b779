"""lmlab's own model folder (:mod:`lmlab.interop.native`): models that no Hugging Face family
expresses (a pre-norm BERT with rotary positions) save, load in a fresh process with the same
outputs, fine-tune, and serve, exactly like Hugging Face folders do."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TOKENIZER_FILES, assert_close_rounding

from lmlab.interop.native import is_native_folder, load_native
from lmlab.models.config import TransformerConfig
from lmlab.models.model import LanguageModel
from lmlab.training.report import save_final_model
from lmlab.utils.catalog import minilm_dir
from lmlab.utils.errors import LmlabError

HIDDEN, LAYERS, FFN = 32, 2, 64


def _prenorm_config(vocab_size: int) -> TransformerConfig:
    """A shape no Hugging Face family has: BERT's embeddings and heads, pre-norm layers with a
    final norm, rotary positions instead of learned ones."""
    return TransformerConfig(vocab_size=vocab_size, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                             num_attention_heads=4, intermediate_size=FFN, pre_norm=True,
                             final_norm=True, position_embedding="rotary",
                             max_position_embeddings=64, hidden_dropout_prob=0.0,
                             attention_probs_dropout_prob=0.0)


@pytest.fixture(scope="module")
def prenorm_folder(tmp_path_factory) -> Path:
    """A random pre-norm rotary BERT with an MLM head, saved as a run saves its final model,
    with MiniLM's tokenizer beside it."""
    source = minilm_dir()
    if source is None:
        pytest.skip("MiniLM tokenizer not available")
    torch.manual_seed(0)
    model = LanguageModel(_prenorm_config(30522), heads=["mlm"])
    folder = tmp_path_factory.mktemp("native") / "model"
    save_final_model(model, folder)
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, folder / name)
    return folder


def _run(code: str, *args: str) -> str:
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_unmappable_model_is_saved_in_lmlab_format(prenorm_folder):
    config = json.loads((prenorm_folder / "config.json").read_text())
    assert is_native_folder(prenorm_folder)
    assert config["lmlab_heads"] == ["mlm"] and config["pre_norm"] is True
    assert config["model_type"] == "lmlab-native"  # refused by transformers, never read as a BERT


def test_native_folder_loads_in_a_fresh_process_with_the_same_logits(prenorm_folder):
    torch.manual_seed(1)
    ids = torch.randint(1000, 2000, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    here = load_native(prenorm_folder)
    with torch.no_grad():
        expected = here(input_ids=ids, attention_mask=mask).logits
    code = """
import json, sys, torch, lmlab
model = lmlab.from_pretrained(sys.argv[1])
ids, mask = torch.tensor(json.loads(sys.argv[2])), torch.tensor(json.loads(sys.argv[3]))
with torch.no_grad():
    logits = model(input_ids=ids, attention_mask=mask).logits
print(json.dumps({"heads": list(model.heads), "tied": model.heads["mlm"].decoder.weight is
                  model.transformer.embeddings.word_embeddings.weight, "logits": logits.tolist()}))
"""
    out = json.loads(_run(code, str(prenorm_folder), json.dumps(ids.tolist()),
                          json.dumps(mask.tolist())))
    assert out["heads"] == ["mlm"] and out["tied"] is True
    assert_close_rounding(torch.tensor(out["logits"]), expected, terms=FFN, depth=LAYERS + 2)


def test_requested_heads_are_fresh_where_the_folder_has_none(prenorm_folder):
    model = load_native(prenorm_folder, head="sequence-classification")
    assert list(model.heads) == ["sequence-classification"]
    assert model.fresh_heads == ["sequence-classification"]
    assert load_native(prenorm_folder).fresh_heads == []


def test_missing_weights_and_wrong_shapes_are_clear_errors(prenorm_folder, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copy(prenorm_folder / "config.json", broken / "config.json")
    with pytest.raises(LmlabError, match="no model.safetensors"):
        load_native(broken)
    config = json.loads((prenorm_folder / "config.json").read_text())
    config["hidden_size"], config["num_attention_heads"] = 64, 4
    (broken / "config.json").write_text(json.dumps(config))
    shutil.copy(prenorm_folder / "model.safetensors", broken / "model.safetensors")
    with pytest.raises(LmlabError, match="mis-shaped"):
        load_native(broken)


@pytest.mark.parametrize("random_init", [False, True])
def test_native_model_fine_tunes_and_serves_in_a_fresh_process(prenorm_folder, tmp_path,
                                                              random_init):
    """`lmlab finetune` reads the folder (pretrained or its architecture at random), saves the
    fine-tuned model in lmlab's format, and a new process serves the same predictions."""
    from lmlab.cli import main

    rows = {"train": [], "dev": []}
    words = {"animal": ["dog", "cat", "horse", "bird"], "tool": ["hammer", "saw", "drill", "file"]}
    for split, count in (("train", 32), ("dev", 8)):
        for i in range(count):
            label = "animal" if i % 2 else "tool"
            rows[split].append({"text": f"the {words[label][(i // 2) % 4]} is here",
                                "label": label})
        (tmp_path / f"{split}.jsonl").write_text(
            "\n".join(json.dumps(row) for row in rows[split]) + "\n")
    run = tmp_path / "run"
    model_arg = [str(prenorm_folder)] + (["--random-init"] if random_init else [])
    assert main(["finetune", "--task", "toy", "--train", str(tmp_path / "train.jsonl"),
                 "--dev", str(tmp_path / "dev.jsonl"), "--model", *model_arg, "--out", str(run),
                 "--epochs", "2", "--lr", "1e-3", "--batch-size", "8",
                 "--precision", "fp32"]) == 0  # served in fp32: the same predictions
    assert is_native_folder(run / "model")
    code = """
import json, sys, lmlab
run, texts = sys.argv[1], json.loads(sys.argv[2])
print(json.dumps([r["label"] for r in lmlab.pipeline("text-classification", model=run)(texts)]))
"""
    texts = [row["text"] for row in rows["dev"]]
    served = json.loads(_run(code, str(run), json.dumps(texts)))
    written = [json.loads(line)["prediction"]
               for line in (run / "predictions-dev.jsonl").read_text().splitlines() if line]
    assert served == written
