"""ULMFiT on AWD-LSTM: the layer groups behind discriminative rates and gradual unfreezing,
concat pooling over real tokens, the ulmfit recipe through `lmlab finetune` (only the head
trains in epoch 0; every group without gradual unfreezing), stage 2 on the task's own text,
reload in a fresh process, and the refusals of other families."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import (
    TOKENIZER_FILES,
    assert_clean_refusal,
    assert_close_rounding,
    run_lmlab_here,
)

import lmlab
from lmlab.finetune.recipes import discriminative_groups, unfreeze_to
from lmlab.interop.recurrent import build_model, load_recurrent
from lmlab.models.pooling import concat_pool
from lmlab.models.rnn.config import recurrent_preset
from lmlab.models.task_heads import add_task_head
from lmlab.utils.errors import LmlabError

ROOT = Path(__file__).resolve().parent.parent
SUBSET = ("from dataclasses import replace\nfrom lmlab.tasks import load_builtin_task\n"
          "task = load_builtin_task('fortunes-topic')\n"
          "task = replace(task, splits={'train': task.split('train')[:48], "
          "'dev': task.split('dev')[:24], 'test': task.split('test')[:24]})\n")


def small_task():
    scope: dict = {}
    exec(SUBSET, scope)  # the same subset the fresh-process check rebuilds
    return scope["task"]


def save_with_tokenizer(model, folder: Path) -> Path:
    from lmlab.utils.catalog import minilm_dir

    lmlab.save_pretrained(model, folder)
    for name in TOKENIZER_FILES:
        if (minilm_dir() / name).exists():
            shutil.copy(minilm_dir() / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def general(tmp_path_factory):
    """A (random) AWD-LSTM language model on MiniLM's vocabulary: the stage-1 model."""
    torch.manual_seed(0)
    config = recurrent_preset("awd-lstm", "tiny", vocab_size=30522, pad_token_id=0)
    return save_with_tokenizer(build_model(config, ["clm"]), tmp_path_factory.mktemp("g") / "lm")


def classifier(general_folder: Path):
    model = load_recurrent(general_folder)
    del model.heads["clm"]
    add_task_head(model, "sequence-classification", 3, pooling="concat")
    return model


def test_discriminative_rates_and_unfreezing_follow_ulmfit_layer_groups(general):
    model = classifier(general)
    groups = discriminative_groups(model, 0.01, 2.6, 0.01)
    rate = {id(p): group["lr"] for group in groups for p in group["params"]}
    expected = [(model.heads, 0.01), (model.layers[2], 0.01 / 2.6),
                (model.layers[1], 0.01 / 2.6 ** 2), (model.layers[0], 0.01 / 2.6 ** 3),
                (model.embeddings, 0.01 / 2.6 ** 4)]
    for module, lr in expected:
        assert all(abs(rate[id(p)] - lr) < 1e-12 for p in module.parameters())
    assert len(rate) == len(list(model.parameters()))  # every parameter in one group
    unfreeze_to(model, 1)  # epoch 1: the head and the last LSTM
    trainable = {name.split(".")[0] + "." + name.split(".")[1]
                 for name, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"heads.sequence-classification", "layers.2"}


@pytest.mark.numerics
def test_concat_pooling_reads_real_tokens_only(general):
    model = classifier(general).eval()
    ids = torch.randint(1000, 2000, (1, 6))
    padded = torch.cat([ids, torch.zeros(1, 4, dtype=torch.long)], 1)
    mask = torch.tensor([[1] * 6 + [0] * 4])
    with torch.no_grad():
        alone = model(ids).logits
        with_padding = model(padded, attention_mask=mask).logits
        hidden = model(ids).last_hidden_state[0]  # (T, H)
        pooled = concat_pool(model(padded, attention_mask=mask).last_hidden_state, mask)[0]
    assert_close_rounding(with_padding, alone, terms=96)
    manual = torch.cat([hidden[-1], hidden.max(0).values, hidden.mean(0)])  # [last, max, mean]
    assert_close_rounding(pooled, manual, terms=6)
    assert model.heads["sequence-classification"].classifier.in_features == 3 * 32


def _body(model) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model.state_dict().items() if not k.startswith("heads.")}


@pytest.mark.parametrize("recipe,body_trains", [("ulmfit", False),
                                                ("ulmfit-no-unfreeze", True)])
def test_ulmfit_recipe_trains_only_the_head_in_its_first_epoch(general, tmp_path, recipe,
                                                              body_trains):
    import lmlab
    from lmlab.finetune.runner import finetune

    result = finetune(small_task(), general, tmp_path / "run", recipe=recipe, epochs=1,
                      batch_size=16, lr=1e-2, show_progress=False, eval_splits=("dev",))
    assert result["pooling"] == "concat" and "dev" in result
    tuned = lmlab.from_pretrained(tmp_path / "run")
    before = _body(load_recurrent(general))
    changed = [k for k, v in _body(tuned).items() if not torch.equal(v, before[k])]
    if body_trains:
        assert {k.split(".")[0] for k in changed} >= {"embeddings", "layers"}
    else:
        assert changed == []  # gradual unfreezing: epoch 0 trains the head alone


@pytest.mark.slow  # ~25 s of CPU: stage 2, stage 3 twice (the resume), a fresh process
def test_run_ulmfit_fine_tunes_the_lm_on_task_text_and_reloads_in_a_fresh_process(
        general, tmp_path):
    from lmlab.finetune.ulmfit import run_ulmfit

    task = small_task()
    result = run_ulmfit(task, general, tmp_path / "u", lm_steps=2, epochs=2, batch_size=16,
                        lr=1e-2, eval_splits=("dev",))
    assert result["lm_eval"]["eval_perplexity"] > 1
    corpus = [text for line in (tmp_path / "u" / "lm-data" / "corpus" / "train.jsonl").open()
              for text in json.loads(line)["sentences"]]
    assert corpus == [e.text for e in task.split("train")]  # the labels dropped
    assert not set(corpus) & {e.text for e in task.split("test")}  # test text is never read
    assert json.loads((tmp_path / "u" / "classifier" / "finetune.json").read_text())[
        "model"] == str(tmp_path / "u" / "lm")
    lm_weights = _body(load_recurrent(tmp_path / "u" / "lm" / "model"))
    assert not all(torch.equal(v, _body(load_recurrent(general))[k])
                   for k, v in lm_weights.items())  # stage 2 moved the LM
    again = run_ulmfit(task, general, tmp_path / "u", lm_steps=2, epochs=2, batch_size=16,
                       lr=1e-2, eval_splits=("dev",))  # resumes: same result
    assert again["dev"] == result["dev"]
    code = (SUBSET + "import sys, json\nfrom lmlab.finetune.runner import load_model, predict\n"
            "model, tok, _ = load_model(sys.argv[1])\n"
            "print(json.dumps(predict(model, tok, task, 'dev')))\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "u" / "classifier")],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    saved = [json.loads(line)["prediction"] for line in
             (tmp_path / "u" / "classifier" / "predictions-dev.jsonl").open()]
    assert json.loads(out.stdout) == saved


def test_other_families_are_refused_before_any_work(general, tiny_bert_folder, tmp_path):
    from lmlab.finetune.ulmfit import run_ulmfit

    config = recurrent_preset("elmo", "tiny", vocab_size=30522)
    elmo = lmlab.save_pretrained(build_model(config, ["bilm"]), tmp_path / "elmo")
    with pytest.raises(LmlabError, match="is an elmo model; ULMFiT fine-tunes a left-to-right"):
        run_ulmfit(small_task(), elmo, tmp_path / "out")
    with pytest.raises(LmlabError, match="is not an AWD-LSTM language model"):
        run_ulmfit(small_task(), tiny_bert_folder, tmp_path / "out")
    with pytest.raises(LmlabError, match="lm_steps -1 is negative"):
        run_ulmfit(small_task(), general, tmp_path / "out", lm_steps=-1)
    assert not (tmp_path / "out").exists()
    result = run_lmlab_here("ulmfit", "--general", tiny_bert_folder, "--task", "fortunes-topic",
                       "--out", tmp_path / "cli")
    assert_clean_refusal(result, "is not an AWD-LSTM language model", fix="--family awd-lstm")
    assert not (tmp_path / "cli").exists()


@pytest.mark.slow
def test_ablation_script_writes_its_table_and_resumes(general, tmp_path):
    args = [sys.executable, str(ROOT / "scripts" / "ulmfit_ablation.py"), "--general",
            str(general), "--tasks", "fortunes-topic", "--seeds", "0", "--lm-steps", "2",
            "--epochs", "2", "--max-train-examples", "48", "--max-eval-examples", "24",
            "--out", str(tmp_path / "abl")]
    first = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
    assert first.returncode == 0, first.stderr[-3000:]
    table = (tmp_path / "abl" / "ablation.md").read_text()
    for variant in ("full", "without LM fine-tuning", "without gradual unfreezing"):
        assert variant in table
    second = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
    assert second.returncode == 0 and "done already" in second.stdout
    assert (tmp_path / "abl" / "ablation.md").read_text() == table



def test_feature_recipe_refuses_an_awd_lstm_whose_layers_differ_in_width(general, tmp_path):
    """AWD-LSTM's hidden states are 32, 64, 64, 32 wide (tiny): the feature recipe, which stacks
    them all, is refused with a clear message before the encoder runs (it raised torch's
    'stack expects each tensor to be equal size')."""
    from lmlab.finetune.runner import finetune

    with pytest.raises(LmlabError, match=r"differ in width \(32, 64, 64, 32\)"):
        finetune(small_task(), general, tmp_path / "feat", recipe="feature", epochs=1,
                 show_progress=False)
