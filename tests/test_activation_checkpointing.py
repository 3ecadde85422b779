"""Activation checkpointing, a speed setting of the Trainer: the same gradients with and without
it (dropout on and off; encoder, decoder, encoder-decoder), fewer activations kept for the
backward pass, the setting kept by a resumed run, and bad values refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import assert_close_rounding, kjv_shards

import lmlab
from lmlab import LmlabError
from lmlab.models.core.transformer import Transformer
from lmlab.models.model import LanguageModel
from lmlab.models.presets import preset
from lmlab.models.seq2seq import EncoderDecoderModel
from lmlab.training import TrainingConfig
from lmlab.training.config import load_config_file
from lmlab.training.metrics_log import read_metrics
from lmlab.training.pretrain import DataSettings, ModelSettings, ObjectiveSettings, PretrainConfig
from lmlab.training.trainer import Trainer

MODELS = {"bert": ("bert", "tiny", LanguageModel, ("mlm",)),
          "llama": ("llama", "2x128", LanguageModel, ("clm",)),
          "t5": ("t5", "tiny", EncoderDecoderModel, ("seq2seq-lm",))}


def build(name: str, dropout: float) -> torch.nn.Module:
    family, size, kind, heads = MODELS[name]
    config = preset(family, size, vocab_size=500, hidden_dropout_prob=dropout,
                    attention_probs_dropout_prob=dropout)
    torch.manual_seed(0)
    return kind(config, heads=heads).train()


def set_checkpointing(model: torch.nn.Module, on: bool) -> None:
    for stack in model.modules():
        if isinstance(stack, Transformer):
            stack.checkpoint_layers = on


def loss_of(model: torch.nn.Module, seed: int = 7) -> torch.Tensor:
    """A padded batch's loss (dropout masks drawn from ``seed``)."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 500, (3, 24), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 15:] = 0
    mask[2, 7:] = 0
    torch.manual_seed(seed)
    if isinstance(model, EncoderDecoderModel):
        out = model(input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :10])
    else:
        out = model(input_ids=ids, attention_mask=mask)
    logits = next(iter(out.head_logits.values()))
    return logits.float().pow(2).mean() + out.last_hidden_state.pow(2).mean()


def gradients(model: torch.nn.Module, on: bool) -> dict[str, torch.Tensor]:
    set_checkpointing(model, on)
    model.zero_grad(set_to_none=True)
    loss_of(model).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("dropout", [0.1, 0.0])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_same_gradients_with_and_without(name, dropout):
    model = build(name, dropout)
    plain, recomputed = gradients(model, False), gradients(model, True)
    assert plain.keys() == recomputed.keys() and len(plain) > 10
    for key, grad in plain.items():  # the recomputation repeats the same ops on the same inputs
        assert_close_rounding(recomputed[key], grad, msg=key)
    if dropout:  # masks were drawn: another seed, another loss
        assert not torch.allclose(loss_of(model), loss_of(model, seed=8))


def saved_bytes(model: torch.nn.Module, on: bool, grad: bool = True) -> int:
    """Bytes the autograd graph keeps for the backward pass of one forward."""
    set_checkpointing(model, on)
    total = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.set_grad_enabled(grad), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss_of(model)
    return total


def test_keeps_fewer_activations_in_training_only():
    model = build("bert", 0.1)
    plain, recomputed = saved_bytes(model, False), saved_bytes(model, True)
    assert recomputed < 0.6 * plain  # the layers' insides are recomputed, not kept
    model.eval()
    assert saved_bytes(model, True) == saved_bytes(model, False)  # evaluation: no recompute


def test_a_cache_being_filled_falls_back():
    model = build("llama", 0.0)
    set_checkpointing(model, True)
    ids = torch.randint(5, 500, (1, 6))
    out = model(input_ids=ids, use_cache=True)  # training mode, gradients on: still one pass
    assert out.past_key_values.seq_len() == 6
    out.last_hidden_state.sum().backward()


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return kjv_shards(tmp_path_factory, train=24, validation=6)


def run_config(out: Path, shards: Path, steps: int, on: bool) -> PretrainConfig:
    training = TrainingConfig(seq_len=32, batch_size=2, lr=1e-3, max_steps=steps, log_every=1,
                              seed=0, progress=False, activation_checkpointing=on)
    return PretrainConfig(out=out, training=training, model=ModelSettings("bert", "tiny"),
                          objective=ObjectiveSettings("mlm"), data=DataSettings(shards, None, 1),
                          track_cost=False)


def test_a_run_and_its_resumption_keep_the_setting(shards, tmp_path, monkeypatch):
    import lmlab.models.core.transformer as core

    calls = []
    original = core.checkpoint

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(core, "checkpoint", counted)
    for name, on in (("plain", False), ("on", True)):  # 2 steps, then resumed and extended
        before = len(calls)
        lmlab.pretrain(run_config(tmp_path / name, shards, 2, on))
        first = len(calls)
        lmlab.pretrain(run_config(tmp_path / name, shards, 4, on))
        assert (first > before and len(calls) > first) if on else len(calls) == before
    config = json.loads((tmp_path / "on" / "config.json").read_text())
    assert config["speed"]["activation_checkpointing"] is True
    plain, recomputed = losses(tmp_path / "plain"), losses(tmp_path / "on")
    assert len(plain) == 4
    assert_close_rounding(recomputed, plain, terms=32 * 2, depth=8)


def losses(run: Path) -> list[float]:
    return [r["loss"] for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"]


def test_bad_values_are_refused(tmp_path):
    with pytest.raises(LmlabError, match="activation_checkpointing must be true or false"):
        TrainingConfig(max_steps=1, activation_checkpointing="yes")
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"hparams": {"activation_checkpointing": True}}))
    with pytest.raises(LmlabError, match="is a speed setting but sits under hparams"):
        PretrainConfig.from_sections(load_config_file(path), out="x")
    path.write_text(json.dumps({"speed": {"activation_checkpointing": 1}}))
    with pytest.raises(LmlabError, match="must be true or false"):
        PretrainConfig.from_sections(load_config_file(path), out="x", max_steps=1)
    from lmlab.interop.recurrent import build_model

    lstm = build_model(preset("awd-lstm", "tiny", vocab_size=50))
    with pytest.raises(LmlabError, match="recomputes Transformer layers"):
        Trainer(lstm, torch.nn.Module(), [], TrainingConfig(max_steps=1,
                activation_checkpointing=True), tmp_path / "run")


def test_the_commands_flags(tiny_bert_folder):
    from lmlab.cli import _register_all
    from lmlab.cli._common import build_parser, pretrain_config
    from lmlab.cli.finetune import config_flags
    from lmlab.finetune.settings import FinetuneConfig

    parser, registry = build_parser()
    _register_all(registry)
    common = ["--out", "o", "--activation-checkpointing"]
    args = parser.parse_args(["pretrain", "--family", "bert", "--size", "tiny", "--steps", "1",
                              *common])
    assert pretrain_config(args).training.to_sections()["speed"]["activation_checkpointing"]
    args = parser.parse_args(["finetune", "--task", "toy", "--model", "m", *common])
    assert FinetuneConfig.from_sections({}, **config_flags(args)).activation_checkpointing
    args = parser.parse_args(["finetune", "--task", "toy", "--model", "m", "--out", "o"])
    assert not FinetuneConfig.from_sections({}, **config_flags(args)).activation_checkpointing


@pytest.mark.filterwarnings("ignore:.*collapsed onto one class")  # two steps: not trained yet
def test_finetuning_with_it_trains_the_same(tiny_bert_folder, tmp_path, monkeypatch):
    from test_finetune import toy_task

    import lmlab.models.core.transformer as core
    from lmlab.finetune.runner import finetune

    calls = []
    original = core.checkpoint
    monkeypatch.setattr(core, "checkpoint", lambda *a, **k: calls.append(1) or original(*a, **k))
    runs = {on: finetune(toy_task(16, 4), tiny_bert_folder, tmp_path / str(on), epochs=1,
                         batch_size=8, show_progress=False, activation_checkpointing=on)
            for on in (False, True)}
    assert calls  # two steps of a two-layer BERT: recomputed
    assert len(losses(tmp_path / "False")) == 2
    assert_close_rounding(losses(tmp_path / "True"), losses(tmp_path / "False"), depth=4)
    assert runs[True]["dev"] == runs[False]["dev"]
    with pytest.raises(LmlabError, match="feature recipe trains a head on frozen features"):
        finetune(toy_task(16, 4), tiny_bert_folder, tmp_path / "f", recipe="feature",
                 activation_checkpointing=True)
    with pytest.raises(LmlabError, match="must be true or false"):
        finetune(toy_task(16, 4), tiny_bert_folder, tmp_path / "f", activation_checkpointing=1)
