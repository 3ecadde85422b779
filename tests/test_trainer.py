"""The training loop: steps, accumulation, evaluation, run directory, NaN stop, param groups.

A tiny MLM objective and an in-memory stream are defined here so the trainer is tested on its
own (the real objectives and stream have their own tests); ``tests/test_trainer_resume.py``
reuses them from a subprocess.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass

import pytest
import torch
from conftest import FakeClock, assert_close_rounding
from torch import nn

from lmlab.models.config import TransformerConfig
from lmlab.models.heads import MaskedLMHead
from lmlab.models.model import LanguageModel
from lmlab.training.config import TrainingConfig
from lmlab.training.hooks import TrainerHook
from lmlab.training.metrics_log import read_metrics
from lmlab.training.trainer import Trainer
from lmlab.utils.errors import LmlabError

VOCAB = 97


@dataclass
class Result:
    loss: torch.Tensor
    metrics: dict
    num_predictions: int


class TinyMLM(nn.Module):
    """Plain masked-LM loss with sparse prediction (the head runs at masked positions only)."""

    name = "mlm"
    head_names = ("mlm",)
    example_format = "packed"
    flops_head = "mlm"  # what the Trainer asks of an objective (lmlab.objectives.base)
    reports_perplexity = True
    predicted_fraction = 0.15

    def __init__(self, nan_at_call: int | None = None):
        super().__init__()
        self.nan_at_call = nan_at_call
        self.calls = 0

    def prepare(self, model: LanguageModel) -> None:
        if "mlm" not in model.heads:
            model.add_head("mlm")

    def compute_loss(self, model: LanguageModel, batch: dict) -> Result:
        self.calls += 1
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    heads=[])
        positions = batch["labels"] != -100
        logits = model.heads["mlm"](out.last_hidden_state, positions=positions)  # (N, V)
        labels = batch["labels"][positions]
        loss = MaskedLMHead.loss(logits, labels)
        if self.training and self.nan_at_call is not None and self.calls >= self.nan_at_call:
            loss = loss * float("nan")
        accuracy = float((logits.argmax(-1) == labels).float().mean())
        return Result(loss, {"accuracy": accuracy}, int(positions.sum()))


def make_batch(index: int, batch_size: int, seq_len: int, seed: int) -> dict:
    """Global batch ``index`` of the sequence: Zipf-distributed ids (a learnable prior), 15%
    masked (id 3 = [MASK])."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + index)
    weights = 1.0 / torch.arange(1, VOCAB - 4, dtype=torch.float)
    ids = 5 + torch.multinomial(weights, batch_size * seq_len, replacement=True, generator=g)
    ids = ids.view(batch_size, seq_len)  # (B, T)
    mask = torch.rand(batch_size, seq_len, generator=g) < 0.15
    mask[:, 1] = True  # at least one prediction per row
    labels = torch.where(mask, ids, torch.full_like(ids, -100))
    inputs = torch.where(mask, torch.full_like(ids, 3), ids)
    return {"input_ids": inputs, "attention_mask": torch.ones_like(ids), "labels": labels}


class TinyStream:
    """Infinite deterministic stream with an exact resume position."""

    def __init__(self, batch_size: int = 8, seq_len: int = 16, seed: int = 0,
                 delay: float = 0.0):
        self.batch_size, self.seq_len, self.seed, self.delay = batch_size, seq_len, seed, delay
        self.index = 0

    def __iter__(self):
        while True:
            if self.delay:
                time.sleep(self.delay)
            batch = make_batch(self.index, self.batch_size, self.seq_len, self.seed)
            self.index += 1
            yield batch

    def state_dict(self) -> dict:
        return {"index": self.index}

    def load_state_dict(self, state: dict) -> None:
        self.index = int(state["index"])


def tiny_model(dropout: float = 0.1, seed: int = 0) -> LanguageModel:
    torch.manual_seed(seed)
    config = TransformerConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                               num_attention_heads=2, intermediate_size=64,
                               max_position_embeddings=64, hidden_dropout_prob=dropout,
                               attention_probs_dropout_prob=dropout)
    return LanguageModel(config, heads=["mlm"])


def run(tmp_path, name="run", model=None, stream=None, objective=None, eval_batches=None,
        **overrides):
    values = dict(lr=1e-3, warmup_steps=2, max_steps=6, log_every=1, progress=False,
                  batch_size=8, seq_len=16)
    values.update(overrides)
    cfg = TrainingConfig(**values)
    trainer = Trainer(model or tiny_model(), objective or TinyMLM(), stream or TinyStream(),
                      cfg, tmp_path / name, eval_batches=eval_batches, track_cost=False)
    return trainer, trainer.train()


def train_losses(run_dir) -> list[float]:
    return [r["loss"] for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"]


class TinyLMWithPerplexity(TinyMLM):
    """TinyMLM that also reports its loss and perplexity per batch, as the LM objectives do."""

    def compute_loss(self, model: LanguageModel, batch: dict) -> Result:
        result = super().compute_loss(model, batch)
        value = float(result.loss)
        result.metrics.update(lm_loss=value, lm_perplexity=math.exp(value))
        return result


def test_losses_are_weighted_by_predictions_and_perplexities_follow_the_mean_loss(tmp_path):
    """Evaluation weights each batch by its number of predictions (the mean over every predicted
    token, not a mean of batch means), and a perplexity is the exp of the averaged loss in
    evaluation and in a training step of several micro-batches (not a mean of their exps)."""
    many = make_batch(0, 8, 16, seed=7)
    few = make_batch(1, 8, 16, seed=7)
    keep = torch.zeros_like(few["labels"], dtype=torch.bool)
    keep[:, 1] = True  # one prediction per row against about 2.4 + 1 in ``many``
    few["labels"] = torch.where(keep, few["labels"], torch.full_like(few["labels"], -100))
    trainer, _ = run(tmp_path, objective=TinyLMWithPerplexity(), eval_batches=[many, few],
                     grad_accum=2, max_steps=3)
    model, objective = trainer.model.eval(), trainer.objective.eval()
    with torch.no_grad():
        parts = [objective.compute_loss(model, batch) for batch in (many, few)]
    counts = [part.num_predictions for part in parts]
    assert counts[0] > 2 * counts[1]
    expected = sum(float(p.loss) * n for p, n in zip(parts, counts)) / sum(counts)
    unweighted = sum(float(p.loss) for p in parts) / 2
    assert abs(expected - unweighted) > 1e-3  # the test can tell the two apart
    evaluation = trainer.evaluate()
    # the same batch losses (a log-softmax over 97 ids, a mean), weighted in another order
    bound = {"terms": VOCAB, "depth": 2}
    assert_close_rounding(evaluation["eval_loss"], expected, **bound, scale=expected)
    assert_close_rounding(evaluation["eval_lm_loss"], expected, **bound, scale=expected)
    assert_close_rounding(evaluation["eval_lm_perplexity"], math.exp(expected), **bound,
                          scale=expected * math.exp(expected))  # d exp(x) = exp(x) dx
    for record in [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl")
                   if r["kind"] == "train"]:
        assert math.isclose(record["lm_perplexity"], math.exp(record["lm_loss"]), rel_tol=1e-9)


def test_run_writes_directory_and_learns(tmp_path):
    eval_batches = [make_batch(i, 8, 16, seed=99) for i in range(2)]
    trainer, result = run(tmp_path, max_steps=30, lr=3e-3, eval_every=10, save_every=10,
                          eval_batches=eval_batches)
    out = tmp_path / "run"
    assert result.step == 30 and result.stop_reason == "max_steps"
    assert result.tokens == 30 * 8 * 16
    config = json.loads((out / "config.json").read_text())
    assert config["hparams"]["lr"] == 3e-3 and config["speed"]["precision"] == "fp32"
    assert "precision" not in config["hparams"] and "lr" not in config["speed"]
    records = read_metrics(out / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 31))
    for key in ("step", "tokens", "loss", "lr", "tokens_per_s", "elapsed", "accuracy"):
        assert key in train[0]
    assert train[-1]["loss"] < train[0]["loss"] - 0.2  # random ids: learns the unigram prior
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [10, 20, 30]
    assert math.isclose(evals[-1]["eval_perplexity"], math.exp(evals[-1]["eval_loss"]))
    assert "eval_accuracy" in evals[-1]
    # keep_last=2: steps 20 and 30 remain, complete; no staging folder left
    names = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert names == ["step-20", "step-30"]
    assert (out / "model" / "config.json").is_file()
    assert (out / "model" / "model.safetensors").is_file()
    report = (out / "report.md").read_text()
    assert "Last evaluation" in report and "eval_loss" in report and (out / "loss.png").is_file()


def test_final_model_loads_back(tmp_path):
    trainer, _ = run(tmp_path, max_steps=3)
    import lmlab

    loaded = lmlab.from_pretrained(tmp_path / "run" / "model", head="mlm")
    batch = make_batch(0, 2, 16, 0)
    trainer.model.eval()
    with torch.no_grad():
        ours = trainer.model(input_ids=batch["input_ids"]).logits
        theirs = loaded(input_ids=batch["input_ids"]).logits
    assert torch.equal(ours, theirs)  # exact: the same float32 weights and the same ops


@pytest.mark.numerics
def test_gradient_accumulation_equals_big_batch(tmp_path):
    _, _ = run(tmp_path, "big", model=tiny_model(0.0), stream=TinyStream(batch_size=8),
               max_steps=4)
    class Halves(TinyStream):  # the same global batches, delivered as two halves
        def __iter__(self):
            for i in range(10**6):
                big = make_batch(i, 8, 16, 0)
                yield {k: v[:4] for k, v in big.items()}
                yield {k: v[4:] for k, v in big.items()}

    _, _ = run(tmp_path, "accum", model=tiny_model(0.0), stream=Halves(), max_steps=4,
               grad_accum=2)
    big, accum = train_losses(tmp_path / "big"), train_losses(tmp_path / "accum")
    assert len(big) == len(accum) == 4
    # Two half-batch means averaged vs one mean, then gradients summed in another order: the
    # rounding of a loss over 97 words, through 4 steps of 2 layers forward and back.
    for a, b in zip(big, accum):
        assert_close_rounding(b, a, terms=VOCAB, depth=4 * 2 * 2, msg=f"{big} {accum}")


def test_nan_loss_stops_with_step_and_checkpoint(tmp_path):
    with pytest.raises(LmlabError) as info:
        run(tmp_path, objective=TinyMLM(nan_at_call=5), max_steps=10, save_every=2)
    message = str(info.value)
    assert "step 5" in message and "step-4" in message
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert records[-1]["kind"] == "diverged" and records[-1]["step"] == 5


def test_token_limit_and_budget_stop(tmp_path, monkeypatch):
    _, result = run(tmp_path, "tok", max_steps=None, max_tokens=3 * 8 * 16)
    assert result.stop_reason == "max_tokens" and result.step == 3

    # The budget is read from the Trainer's clock; a fake one that moves 0.1 s per batch makes
    # the step count independent of how busy the machine is (5 steps fit in 0.5 s).
    clock = FakeClock()

    class ClockedStream(TinyStream):
        def __iter__(self):
            for batch in super().__iter__():
                clock.now += 0.1
                yield batch

    monkeypatch.setattr("lmlab.training.trainer.time", clock)
    _, result = run(tmp_path, "budget", max_steps=None, budget_seconds=0.5,
                    stream=ClockedStream())
    assert result.stop_reason == "budget" and result.step == 5
    lrs = [r["lr"] for r in read_metrics(tmp_path / "budget" / "metrics.jsonl")
           if r["kind"] == "train"]
    assert lrs[0] == 0.0 and max(lrs) > 0  # warmup, then decay towards the budget's end


def test_changed_hparams_refuse_to_resume(tmp_path):
    run(tmp_path, max_steps=2)
    with pytest.raises(LmlabError, match=r"other settings .*lr: 0\.001 -> 0\.0005"):
        run(tmp_path, max_steps=4, lr=5e-4)
    _, result = run(tmp_path, max_steps=4)  # a longer run of the same config extends it
    assert result.step == 4


def test_param_groups_exclude_bias_and_norms():
    from lmlab.training.optim import param_groups

    model = tiny_model()
    groups = {g["group"]: g for g in param_groups([model, TinyMLM()], 0.01)}
    no_decay = set(groups["no_decay"]["names"])
    decay = set(groups["decay"]["names"])
    assert "0:transformer.embeddings.word_embeddings.weight" in decay  # BERT decays embeddings
    assert any("norm" in n.lower() and n.endswith("weight") for n in no_decay)
    assert all(n.endswith("bias") or "norm" in n.lower() for n in no_decay)
    assert not any(n.endswith("bias") for n in decay)
    # the tied decoder weight is the embedding: listed once in total
    total = sum(len(g["params"]) for g in groups.values())
    assert total == len({id(p) for p in model.parameters()})
    assert groups["no_decay"]["weight_decay"] == 0.0


def test_bf16_autocast_keeps_fp32_weights(tmp_path):
    trainer, result = run(tmp_path, precision="bf16", max_steps=2)
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    assert math.isfinite(result.last_loss)


def test_config_sections_roundtrip_and_errors(tmp_path):
    cfg = TrainingConfig(max_steps=5, precision="bf16", lr=2e-4)
    again = TrainingConfig.from_sections(cfg.to_sections())
    assert again == cfg
    with pytest.raises(LmlabError, match="move it under speed"):
        TrainingConfig.from_sections({"hparams": {"max_steps": 1, "precision": "bf16"}})
    with pytest.raises(LmlabError, match="no end"):
        TrainingConfig()
    with pytest.raises(LmlabError, match="schedule"):
        TrainingConfig(max_steps=1, schedule="wobbly")


@pytest.mark.slow
def test_compile_flag_is_wired(tmp_path):
    trainer, result = run(tmp_path, compile=True, max_steps=2)
    assert result.step == 2 and getattr(trainer.model, "_compiled_call_impl", None) is not None


def test_compile_flag_reaches_model(tmp_path, monkeypatch):
    called = []
    monkeypatch.setattr(LanguageModel, "compile", lambda self, *a, **k: called.append(True))
    run(tmp_path, compile=True, max_steps=1)
    assert called == [True]


def test_finite_stream_ends_the_run(tmp_path):
    class Finite(TinyStream):
        def __iter__(self):
            for _ in range(3):
                yield make_batch(self.index, 8, 16, 0)
                self.index += 1

    _, result = run(tmp_path, stream=Finite(), max_steps=10)
    assert result.stop_reason == "end_of_data" and result.step == 3


def test_cost_counts_the_vocabulary_projection_only_where_mlm_predicts():
    """Sparse MLM pays the vocabulary projection at the masked share of positions only; the
    cost report must count that, not the dense projection (or MFU reads too high)."""
    from lmlab.objectives import SpecialTokens, build_objective

    special = SpecialTokens(vocab_size=100, pad_id=0, cls_id=1, sep_id=2, mask_id=3,
                            special_ids=(0, 1, 2, 3))
    combined = build_objective("mlm,sop", special)
    assert combined.predicted_fraction == 0.15 and combined.flops_head == "mlm"
    assert not combined.reports_perplexity  # MLM + SOP: a sum of losses
    dense = build_objective("mlm", special, sparse=False)
    assert dense.predicted_fraction is None and dense.reports_perplexity
    clm = build_objective("clm", special)
    assert clm.flops_head == "clm" and clm.reports_perplexity and clm.predicted_fraction is None
    rtd = build_objective("rtd", special)
    assert rtd.flops_head == "none" and not rtd.reports_perplexity
    span = build_objective("span", special)
    assert span.flops_head == "mlm" and not span.reports_perplexity  # span + SBO losses


class Recorder(TrainerHook):
    """Records every call; stops the run at ``stop_at``; checkpoints a counter (file + JSON)."""

    def __init__(self, stop_at: int | None = None, stop_at_start: str | None = None):
        self.calls: list[tuple[str, int]] = []
        self.count = 0
        self.stop_at, self.stop_at_start = stop_at, stop_at_start
        self.loaded: tuple[int, str] | None = None

    def on_train_start(self, trainer):
        self.calls.append(("start", trainer.step))
        return self.stop_at_start

    def on_step_start(self, trainer):
        self.calls.append(("step_start", trainer.step))

    def on_step_end(self, trainer):
        self.count += 1
        self.calls.append(("step_end", trainer.step))
        return "enough" if trainer.step == self.stop_at else None

    def on_train_end(self, trainer):
        self.calls.append(("end", trainer.step))

    def save(self, folder):
        (folder / "recorder.txt").write_text(str(self.count))
        return {"count": self.count}

    def load(self, folder, state):
        self.count = state["count"]
        self.loaded = (state["count"], (folder / "recorder.txt").read_text())


def run_with_hook(tmp_path, hook, **overrides):
    values = dict(lr=1e-3, max_steps=6, log_every=1, progress=False, save_every=2)
    values.update(overrides)
    trainer = Trainer(tiny_model(), TinyMLM(), TinyStream(), TrainingConfig(**values),
                      tmp_path / "hooked", track_cost=False, hooks=[hook])
    return trainer.train()


def test_hooks_are_called_stop_the_run_and_resume_with_their_state(tmp_path):
    first = Recorder(stop_at=3)
    result = run_with_hook(tmp_path, first)
    assert result.stop_reason == "enough" and result.step == 3  # a hook's reason ends the run
    assert first.calls == [("start", 0), ("step_start", 0), ("step_end", 1), ("step_start", 1),
                           ("step_end", 2), ("step_start", 2), ("step_end", 3), ("end", 3)]
    # rerun: resumes from the final checkpoint (step 3) with the hook's saved state
    second = Recorder()
    result = run_with_hook(tmp_path, second)
    assert second.loaded == (3, "3") and result.step == 6 and second.count == 6
    assert second.calls[0] == ("start", 3) and second.calls[-1] == ("end", 6)
    # a hook may end a (resumed) run before its first step
    third = Recorder(stop_at_start="already stopped")
    result = run_with_hook(tmp_path, third, max_steps=8)
    assert result.stop_reason == "already stopped" and result.step == 6
    assert third.calls == [("start", 6), ("end", 6)]


def padded_stream(seed: int = 0):
    """TinyStream batches with right padding (rows of 6..16 real tokens; labels off padding)."""
    class Padded(TinyStream):
        def __iter__(self):
            for batch in super().__iter__():
                lengths = 6 + torch.arange(self.batch_size) % 11
                mask = (torch.arange(self.seq_len)[None, :] < lengths[:, None]).long()  # (B, T)
                labels = batch["labels"].masked_fill(mask == 0, -100)
                labels[:, 1] = batch["labels"][:, 1]  # position 1 is real and predicted
                yield {"input_ids": batch["input_ids"] * mask, "attention_mask": mask,
                       "labels": labels}

    return Padded(seed=seed)


def test_skip_padding_setting_changes_speed_not_losses(tmp_path, monkeypatch):
    from lmlab.models.core.unpad import PaddingIndex

    unpadded = []
    original = PaddingIndex.from_mask.__func__
    monkeypatch.setattr(PaddingIndex, "from_mask",
                        classmethod(lambda cls, mask: unpadded.append(1) or original(cls, mask)))
    run(tmp_path, "skip", model=tiny_model(0.0), stream=padded_stream(), max_steps=4)
    skipped = len(unpadded)
    run(tmp_path, "full", model=tiny_model(0.0), stream=padded_stream(), max_steps=4,
        skip_padding=False)
    assert skipped >= 4 and len(unpadded) == skipped  # off: the padding is computed
    config = json.loads((tmp_path / "full" / "config.json").read_text())
    assert config["speed"]["skip_padding"] is False and "attention" not in config["speed"]
    for a, b in zip(train_losses(tmp_path / "skip"), train_losses(tmp_path / "full")):
        assert_close_rounding(b, a, terms=VOCAB, depth=4 * 2 * 2)


def test_fused_adamw_trains_as_the_per_tensor_loop(tmp_path, monkeypatch):
    """The Trainer's AdamW is torch's fused kernel where the parameters allow it (several times
    faster on the CPU, bench/bench_elementwise.py); the losses and weights follow the per-tensor
    loop it replaced up to float rounding."""
    from lmlab.training import optim

    fused, _ = run(tmp_path, "fused", model=tiny_model(0.0), max_steps=4)
    assert fused.optimizer.defaults["fused"] is True
    monkeypatch.setattr(optim, "fused_adamw", lambda groups: False)
    loop, _ = run(tmp_path, "loop", model=tiny_model(0.0), max_steps=4)
    assert not loop.optimizer.defaults["fused"]
    for a, b in zip(train_losses(tmp_path / "fused"), train_losses(tmp_path / "loop")):
        assert_close_rounding(b, a, terms=VOCAB, depth=4 * 2 * 2)
    for mine, theirs in zip(fused.model.parameters(), loop.model.parameters()):
        # tol: AdamW's step is lr * m / (sqrt(v) + eps), about lr (1e-3) per weight whatever the
        # gradient's size: another rounding order moves it by float32 rounding of that, far
        # below 1e-5 after 4 steps, while one step of difference would be 1e-3
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-5)
