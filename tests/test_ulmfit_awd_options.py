"""ULMFiT's and AWD-LSTM's options: AR/TAR against Merity et al.'s code, NT-ASGD against its
trigger rule and torch's ASGD (what Merity et al. switch to), discriminative rates in stage 2
(lmlab pretrain's lr_decay), the 50-unit batch-norm head against fastai's layers, and the whole
through a small pretraining run and `lmlab ulmfit`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import assert_clean_refusal, assert_close_rounding, kjv_shards, run_lmlab_here
from test_ulmfit import ROOT, save_with_tokenizer, small_task

from lmlab.interop.recurrent import build_model, load_recurrent
from lmlab.models.rnn.config import recurrent_preset
from lmlab.models.task_heads import add_task_head
from lmlab.objectives.causal import CausalLM, activation_penalties
from lmlab.objectives.special_tokens import SpecialTokens
from lmlab.training.ntasgd import NTASGD
from lmlab.training.optim import layer_rate_groups
from lmlab.utils.errors import LmlabError

NO_DROPOUT = {"embed_p": 0.0, "input_p": 0.0, "hidden_p": 0.0, "weight_p": 0.0, "output_p": 0.0}


def tiny_awd(**overrides):
    torch.manual_seed(0)
    return build_model(recurrent_preset("awd-lstm", "tiny", vocab_size=60, **overrides), ["clm"])


# -- AR / TAR ----------------------------------------------------------------------------------
@pytest.mark.numerics
def test_ar_tar_are_merity_et_al_s_terms():
    """Merity et al.'s main.py: ``alpha * dropped_rnn_hs[-1].pow(2).mean()`` and
    ``beta * (rnn_hs[-1][1:] - rnn_hs[-1][:-1]).pow(2).mean()`` on (T, B, H) tensors."""
    torch.manual_seed(1)
    dropped, raw = torch.randn(3, 7, 5), torch.randn(3, 7, 5)
    full = torch.ones(3, 7)
    got = activation_penalties(dropped, raw, full, 2.0, 1.0)
    dropped_t, raw_t = dropped.transpose(0, 1), raw.transpose(0, 1)  # (T, B, H), as theirs
    expected = 2.0 * dropped_t.pow(2).mean() + 1.0 * (raw_t[1:] - raw_t[:-1]).pow(2).mean()
    assert_close_rounding(got, expected, terms=105, depth=3)
    # padding counts nowhere: the same as the real part alone
    padded = activation_penalties(torch.cat([dropped, 9 * torch.ones(3, 2, 5)], 1),
                                  torch.cat([raw, 9 * torch.ones(3, 2, 5)], 1),
                                  torch.cat([full, torch.zeros(3, 2)], 1), 2.0, 1.0)
    assert_close_rounding(padded, expected, terms=105, depth=3)


@pytest.mark.numerics
def test_clm_with_ar_tar_adds_them_in_training_only():
    model = tiny_awd(**NO_DROPOUT).train()
    special = SpecialTokens(vocab_size=60, pad_id=0, cls_id=1, sep_id=2, eos_id=2)
    plain, regularised = CausalLM(special), CausalLM(special, ar=2.0, tar=1.0)
    regularised.prepare(model)
    ids = torch.randint(3, 60, (4, 12))
    batch = plain.corrupt({"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                          torch.Generator())
    base = plain.compute_loss(model, batch)
    result = regularised.compute_loss(model, batch)
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True, heads=[])
        raw = out.hidden_states[-1].transpose(0, 1)  # no dropout: dropped == raw
        penalty = 2.0 * raw.pow(2).mean() + (raw[1:] - raw[:-1]).pow(2).mean()
    assert_close_rounding(result.loss, base.loss + penalty, terms=60, depth=6,
                          scale=float(base.loss.detach()))
    assert result.metrics["clm_activation_penalty"] > 0
    regularised.eval()  # evaluation reports the language-model loss alone
    assert torch.equal(regularised.compute_loss(model, batch).loss, base.loss)  # exact: same ops
    with pytest.raises(LmlabError, match="ar 2, tar 1"):
        CausalLM(special, ar=-1.0)


# -- NT-ASGD ------------------------------------------------------------------------------------
def test_nt_asgd_trigger_is_merity_et_al_s_rule():
    """``'t0' not in optimizer.param_groups[0] and (len(best_val_loss) > nonmono and val_loss >
    min(best_val_loss[:-nonmono]))``, then ``best_val_loss.append(val_loss)``, every epoch."""
    optimizer = NTASGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0, nonmono=2)
    losses = [5.0, 4.0, 3.0, 3.5, 2.9, 3.1, 3.2]
    fired, history, switched = [], [], False
    for loss in losses:
        fired.append(optimizer.observe(loss))
        theirs = not switched and len(history) > 2 and loss > min(history[:-2])  # 't0' not in
        switched |= theirs
        history.append(loss)
        assert fired[-1] == theirs
    assert fired == [False] * 5 + [True, False]  # 3.1 > min(5, 4, 3); then switched
    assert optimizer.triggered


@pytest.mark.numerics
def test_nt_asgd_is_sgd_then_torch_asgd_and_saves_its_state():
    torch.manual_seed(2)
    weights = torch.randn(4, 3)
    ours = torch.nn.Parameter(weights.clone())
    sgd = torch.nn.Parameter(weights.clone())
    optimizer = NTASGD([ours], lr=0.1, weight_decay=0.01)
    reference = torch.optim.SGD([sgd], lr=0.1, weight_decay=0.01)
    grads = [torch.randn(4, 3) for _ in range(9)]
    for grad in grads[:4]:  # before the trigger: SGD, op for op
        ours.grad, sgd.grad = grad.clone(), grad.clone()
        optimizer.step()
        reference.step()
    assert torch.equal(ours, sgd)  # exact: the same update, op for op
    for loss in [3.0, 2.0, 1.0, 0.5, 0.4, 0.3, 5.0]:
        optimizer.observe(loss)
    assert optimizer.triggered
    asgd_param = torch.nn.Parameter(ours.detach().clone())
    asgd = torch.optim.ASGD([asgd_param], lr=0.1, t0=0, lambd=0.0, weight_decay=0.01)
    for grad in grads[4:]:
        ours.grad, asgd_param.grad = grad.clone(), grad.clone()
        optimizer.step()
        asgd.step()
    assert_close_rounding(ours, asgd_param, terms=5, depth=5, scale=float(ours.detach().abs().max()))
    expected = asgd.state[asgd_param]["ax"]
    average = optimizer.state[ours]["ax"]
    assert_close_rounding(average, expected, terms=5, depth=5, scale=float(expected.abs().max()))
    iterate = ours.detach().clone()
    with optimizer.averaged():
        assert torch.equal(ours, average)  # exact: copied
    assert torch.equal(ours, iterate)  # exact: put back
    again = NTASGD([torch.nn.Parameter(iterate.clone())], lr=0.1, weight_decay=0.01)
    again.load_state_dict(optimizer.state_dict())
    assert again.triggered and again.param_groups[0]["nt_history"][-1] == 5.0


# -- discriminative rates in pretraining, the batch-norm head ------------------------------------
def test_layer_rate_groups_divide_by_lr_decay_per_group_down():
    model = tiny_awd()
    groups = layer_rate_groups(model, [], 1e-2, 2.6, 0.01)
    depth_of = {id(p): g["depth"] for g in groups for p in g["params"]}
    assert len(depth_of) == sum(1 for _ in model.parameters())  # each parameter once
    for group in groups:
        assert group["lr"] == pytest.approx(1e-2 / 2.6 ** group["depth"])
    assert depth_of[id(model.embeddings.weight)] == 0  # tied: the decoder's group, the top
    assert depth_of[id(model.layers[0].lstm.weight_hh_l0)] == 3
    assert depth_of[id(model.layers[2].lstm.weight_hh_l0)] == 1


@pytest.mark.numerics
def test_batchnorm_head_is_fastais_pooling_linear_classifier(tmp_path):
    """fastai's PoolingLinearClassifier([3E, 50, n], ps=[0.4, 0.1]): LinBnDrop(3E, 50, p=0.4,
    ReLU) then LinBnDrop(50, n, p=0.1): BatchNorm1d, Dropout, Linear(bias=False) (, ReLU)."""
    model = tiny_awd(extra={"classifier_hidden": 50, "num_labels": 3})
    head = add_task_head(model, "sequence-classification", 3, pooling="concat")
    layers = head.classifier
    assert [type(m).__name__ for m in layers] == ["BatchNorm1d", "Dropout", "Linear", "ReLU",
                                                  "BatchNorm1d", "Dropout", "Linear"]
    assert (layers[0].num_features, layers[2].out_features, layers[6].out_features) == (96, 50, 3)
    assert layers[2].bias is None and layers[6].bias is None
    assert (layers[1].p, layers[5].p) == (0.4, 0.1)
    model.eval()
    with torch.no_grad():
        for bn in (layers[0], layers[4]):  # running statistics off their start
            bn.running_mean.normal_()
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.normal_()
            bn.bias.normal_()
        ids = torch.randint(3, 60, (2, 9))
        mask = torch.ones_like(ids)
        pooled = torch.from_numpy(model(input_ids=ids, heads=[]).last_hidden_state.numpy())
        from lmlab.models.pooling import concat_pool

        x = concat_pool(pooled, mask)

        def bn(layer, v):
            return ((v - layer.running_mean) / torch.sqrt(layer.running_var + layer.eps)
                    * layer.weight + layer.bias)

        hidden = torch.relu(bn(layers[0], x) @ layers[2].weight.T)
        expected = bn(layers[4], hidden) @ layers[6].weight.T
        got = model(input_ids=ids, attention_mask=mask,
                    heads=["sequence-classification"]).logits
    assert_close_rounding(got, expected, terms=96, depth=6)
    save_with_tokenizer(model, tmp_path / "clf")
    code = ("import sys, json, torch\nimport lmlab\n"
            "model = lmlab.from_pretrained(sys.argv[1]).eval()\n"
            f"ids = torch.tensor({ids.tolist()})\n"
            "print(json.dumps(model(input_ids=ids, heads=['sequence-classification'])"
            ".logits.tolist()))\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "clf")],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    assert torch.equal(torch.tensor(json.loads(out.stdout)), got)  # exact: same weights, ops
    with pytest.raises(LmlabError, match="hidden classifier layer"):
        bert_like = tiny_awd(extra={"classifier_hidden": 50})
        bert_like.config.family = "bert"  # a [CLS] layout: no pooled vector to put it on
        add_task_head(bert_like, "sequence-classification", 2, pooling="cls")


# -- through a run -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return kjv_shards(tmp_path_factory, 12, 2)


def test_pretrain_with_nt_asgd_lr_decay_and_ar_tar_saves_the_average(shards, tmp_path):
    """A run that diverges (SGD at a huge rate) triggers NT-ASGD after 6 evaluations; its saved
    model is the optimizer's average, its checkpoint the iterates; the groups' rates fall by
    2.6 per layer group."""
    from safetensors.torch import load_file

    import lmlab
    from lmlab.training.pretrain import PretrainConfig, pretrain

    config = PretrainConfig.from_sections(
        None, family="awd-lstm", size="tiny", objective="clm", shards=str(shards),
        out=str(tmp_path / "run"), max_steps=10, lr=300.0, schedule="constant", batch_size=4,
        seq_len=16, eval_every=1, log_every=1, optimizer="nt-asgd", lr_decay=2.6,
        objective_args={"ar": 2.0, "tar": 1.0}, progress=False, track_cost=False,
        eval_batches=1, weight_decay=0.0)
    pretrain(config)
    checkpoint = sorted((tmp_path / "run" / "checkpoints").iterdir())[-1]
    state = torch.load(checkpoint / "optimizer.pt", weights_only=False)
    groups = state["param_groups"]
    assert sorted({round(g["initial_lr"] * 2.6 ** g["depth"], 6) for g in groups}) == [300.0]
    assert groups[0]["nt_trigger_step"] is not None, groups[0]["nt_history"]
    averages = [s["ax"] for s in state["state"].values() if "ax" in s]
    saved = lmlab.from_pretrained(tmp_path / "run" / "model").state_dict()
    iterates = load_file(str(checkpoint / "model.safetensors"))
    name = "layers.0.lstm.weight_hh_l0"
    assert not torch.equal(saved[name], iterates[name])
    assert any(torch.equal(saved[name], ax) for ax in averages)  # exact: the average, saved
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert any("clm_activation_penalty" in r for r in rows if r["kind"] == "train")


def test_refusals_before_any_work(shards, tmp_path):
    from lmlab.training.config import TrainingConfig
    from lmlab.training.pretrain import PretrainConfig

    with pytest.raises(LmlabError, match="lr_decay must be at least 1"):
        TrainingConfig(max_steps=1, lr_decay=0.5)
    with pytest.raises(LmlabError, match="unknown optimizer 'sgd'"):
        TrainingConfig(max_steps=1, optimizer="sgd")
    config = PretrainConfig.from_sections(
        None, family="bert", size="tiny", objective="mlm", shards=str(shards),
        out=str(tmp_path / "bert"), max_steps=1, lr_decay=2.6)
    with pytest.raises(LmlabError, match="lr_decay sets ULMFiT's rate per layer group"):
        config.validate()
    with pytest.raises(LmlabError, match="ar/tar regularise an AWD-LSTM"):
        special = SpecialTokens(vocab_size=60, pad_id=0, cls_id=1, sep_id=2)
        CausalLM(special, ar=2.0).prepare(build_model(
            recurrent_preset("elmo", "tiny", vocab_size=60), ["bilm"]))


def test_ulmfit_command_refuses_bad_stage_2_options(tmp_path):
    torch.manual_seed(0)
    general = save_with_tokenizer(build_model(recurrent_preset(
        "awd-lstm", "tiny", vocab_size=30522, pad_token_id=0), ["clm"]), tmp_path / "lm")
    for flags, problem in ((("--lm-lr-decay", 0.5), "lm_lr_decay 0.5 is below 1"),
                           (("--lm-ar", -1), "lm ar -1.0 is negative")):
        result = run_lmlab_here("ulmfit", "--general", general, "--task", "fortunes-topic",
                                *flags, "--out", tmp_path / "u")
        assert_clean_refusal(result, problem, fix="use")
        assert not (tmp_path / "u").exists()


@pytest.mark.slow  # ~18 s: a fine-tuning run on MiniLM's 30k vocabulary
def test_ulmfit_stage_3_with_the_batchnorm_head(tmp_path):
    from lmlab.finetune.runner import finetune

    torch.manual_seed(0)
    general = save_with_tokenizer(build_model(recurrent_preset(
        "awd-lstm", "tiny", vocab_size=30522, pad_token_id=0), ["clm"]), tmp_path / "lm")
    result = finetune(small_task(), general, tmp_path / "run", recipe="ulmfit", epochs=1,
                      batch_size=16, lr=1e-2, head_hidden=50, show_progress=False,
                      eval_splits=("dev",))
    assert result["recipe"]["head_hidden"] == 50
    tuned = load_recurrent(tmp_path / "run" / "model")
    assert tuned.config.extra["classifier_hidden"] == 50
    assert tuned.heads["sequence-classification"].classifier[2].out_features == 50


def test_finetune_command_refuses_a_bad_head_hidden(tmp_path):
    result = run_lmlab_here("finetune", "--task", "fortunes-topic", "--model", "minilm",
                            "--recipe", "ulmfit", "--head-hidden", 0, "--out", tmp_path / "r")
    assert_clean_refusal(result, "--head-hidden", fix="--head-hidden 1 or more")
    assert not (tmp_path / "r").exists()
