"""Time to quality: our bert-mini's validation MLM loss against the reference's, same budget.

Both sides get the same wall-clock training budget (default 10 minutes each, run one after the
other: it is a race against the clock, not a throughput sample), the same threads, the same
token shards and the same packed windows in the same order, and are scored on the same
fixed-mask validation batches:

* **ours**: lmlab's real :class:`~lmlab.training.trainer.Trainer` (what ``lmlab pretrain``
  runs): a ``preset("bert", size)`` model, ``build_objective("mlm")`` (BERT's 15% / 80-10-10,
  sparse prediction), AdamW with BERT's decay exclusions, linear warmup + decay whose horizon
  follows the measured step time so the decay ends with the budget.
* **reference**: transformers' ``BertForMaskedLM`` (``attn_implementation="sdpa"``) with the
  same configuration, trained on the *same* packed windows (a second
  :class:`~lmlab.data.pretraining.PretrainingStream` with the same seed, left uncorrupted)
  masked by ``transformers.DataCollatorForLanguageModeling`` (mlm_probability 0.15), torch
  AdamW with the same hyperparameters and decay exclusions (biases, LayerNorm weights),
  ``get_linear_schedule_with_warmup`` and gradient clipping at the same norm, driven by
  ``transformers.Trainer`` itself (its optimizer, scheduler, clipping and data loader; a
  callback evaluates and stops it at the budget). Trainer needs ``accelerate`` (in the dev
  extras); without it the same loop written by hand runs instead (the JSON says which, and
  ``--reference-loop plain`` forces it). A linear schedule needs its step count up front, so the
  reference times a few steps of a throwaway copy before its clock starts and plans
  ``budget / step time`` steps; it stops at the budget or at the planned count, whichever
  comes first.

Validation: ``validation_batches`` (seed 1234) masked once by *our* objective; the reference is
evaluated on exactly those inputs and labels (``BertForMaskedLM(..., labels=...)``), so both
curves measure the same thing. Evaluation runs every ``--eval-every-seconds`` of training time,
at the start and at the end; its time is excluded from the clock on both sides (ours: the
trainer's clock is paused while evaluating, so its budget and LR horizon are training time only).

Run it as the Makefile does, under the same allocator settings for both sides:

    GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736 \\
        .venv/bin/python bench/bench_time_to_quality.py \\
        --shards runs/demo/stages/shards-*/shards --budget 10m --out runs/time-to-quality

Outputs in ``--out``: ``time_to_quality.json`` (both curves as ``[train_seconds, val_loss]``,
final losses, tokens, tokens/s, settings, environment) and ``time_to_quality.png``.
"""

from __future__ import annotations

import argparse
import copy
import glob
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import environment  # noqa: E402

from lmlab.utils.errors import LmlabError  # noqa: E402

DEFAULT_SHARDS = "runs/demo/stages/shards-*/shards"
RECOMMENDED_TUNABLES = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736"
CALIBRATION_STEPS = 6  # timed reference steps (after one untimed) that plan its schedule


# ------------------------------------------------------------------------------------- inputs
def resolve_folder(pattern: str, what: str) -> Path:
    """A folder from a path or a glob pattern (the newest match when several)."""
    matches = sorted(glob.glob(pattern), key=os.path.getmtime) if glob.has_magic(pattern) \
        else ([pattern] if os.path.exists(pattern) else [])
    if not matches:
        raise LmlabError(f"no {what} at {pattern}",
                         f"pass --{what} with an existing folder (e.g. run `make demo` first "
                         "for runs/demo/stages/...)")
    return Path(matches[-1])


class PassThrough:
    """A stand-in objective for :class:`PretrainingStream` that leaves batches uncorrupted.

    The stream picks windows from the objective's ``example_format`` and calls ``corrupt``;
    with this object it yields the clean packed windows (same order as our training stream
    for the same seed), which the reference then masks with its own collator.
    """

    example_format = "packed"
    head_names = ("mlm",)

    def __init__(self, special: Any):
        self.special = special

    def data_epoch(self, epoch: int) -> int:
        return epoch

    def corrupt(self, batch: dict[str, torch.Tensor],
                rng: torch.Generator) -> dict[str, torch.Tensor]:
        return batch


def time_to_reach(curve: list[list[float]], target: float) -> float | None:
    """Training seconds at which a ``[[seconds, loss], ...]`` curve first reaches ``target``
    (linear interpolation between evaluations), or None if it never does."""
    for index, (seconds, loss) in enumerate(curve):
        if loss <= target:
            if index == 0:
                return float(seconds)
            s0, l0 = curve[index - 1]
            return float(s0 + (seconds - s0) * (l0 - target) / max(l0 - loss, 1e-12))
    return None


# --------------------------------------------------------------------------------------- ours
def run_ours(args: argparse.Namespace, shards: Path, tokenizer: Any, special: Any,
             val: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
    """lmlab's Trainer for ``budget`` seconds of training time, evaluated on ``val`` every
    ``eval_every_seconds`` of that time."""
    from lmlab.data.pretraining import PretrainingStream
    from lmlab.models.model import LanguageModel
    from lmlab.models.presets import preset
    from lmlab.objectives.registry import build_objective
    from lmlab.training.config import TrainingConfig
    from lmlab.training.trainer import Trainer, seed_everything

    class TimedEvalTrainer(Trainer):
        """The Trainer, evaluating by training time with its clock paused meanwhile, and
        writing neither checkpoints nor a final model (not part of the race)."""

        def __init__(self, *positional: Any, eval_every_seconds: float, **named: Any):
            super().__init__(*positional, **named)
            self.eval_every_seconds = eval_every_seconds
            self.curve: list[list[float]] = []
            self.eval_seconds = 0.0
            self._next_eval = 0.0
            self._evaluated_step: int | None = None

        def _timed_eval(self, elapsed: float) -> None:
            started = time.perf_counter()
            results = super().evaluate()
            spent = time.perf_counter() - started
            self._session_start += spent  # pause the run's clock (budget and LR horizon)
            self.eval_seconds += spent
            self.last_eval = results
            self.curve.append([round(elapsed, 3), results["eval_loss"]])
            self._evaluated_step = self.step

        def _stop_reason(self, elapsed: float) -> str | None:
            stop = super()._stop_reason(elapsed)
            due = stop is not None or elapsed >= self._next_eval
            if due and self._evaluated_step != self.step:
                self._timed_eval(elapsed)
                while self._next_eval <= elapsed:
                    self._next_eval += self.eval_every_seconds
            return stop

        def evaluate(self) -> dict[str, float]:
            # the run's final evaluation: timed into the curve unless this step just was
            if self._evaluated_step != self.step:
                self._timed_eval(self.elapsed())
            return self.last_eval

        def save_checkpoint(self) -> Any:
            return None

        def _finish(self, cost: Any) -> None:
            return None

    seed_everything(args.seed)
    config = preset("bert", args.size, vocab_size=len(tokenizer),
                    pad_token_id=tokenizer.pad_token_id)
    model = LanguageModel(config, heads=())
    objective = build_objective("mlm", special)
    stream = PretrainingStream(shards, split="train", objective=objective,
                               batch_size=args.batch_size, seq_len=args.seq_len, seed=args.seed)
    cfg = TrainingConfig(lr=args.lr, warmup_fraction=args.warmup, weight_decay=args.weight_decay,
                         clip_norm=args.clip_norm, budget_seconds=args.budget_seconds,
                         batch_size=args.batch_size, seq_len=args.seq_len, seed=args.seed,
                         threads=args.threads, progress=False, log_every=50, keep_last=1)
    with tempfile.TemporaryDirectory(prefix="lmlab-ttq-") as out:
        trainer = TimedEvalTrainer(model, objective, stream, cfg, out, eval_batches=val,
                                   track_cost=False, eval_every_seconds=args.eval_every_seconds)
        result = trainer.train()
    train_seconds = trainer.curve[-1][0]
    return {"loop": "lmlab Trainer (lmlab pretrain's loop)", "curve": trainer.curve,
            "final_val_loss": trainer.curve[-1][1], "steps": result.step,
            "tokens": result.tokens, "train_seconds": train_seconds,
            "tokens_per_s": result.tokens / max(train_seconds, 1e-9),
            "eval_seconds": round(trainer.eval_seconds, 2), "stop_reason": result.stop_reason,
            "model_parameters": sum(p.numel() for p in model.parameters()),
            "config": {"lr": cfg.lr, "warmup_fraction": cfg.warmup_fraction,
                       "weight_decay": cfg.weight_decay, "betas": list(cfg.betas),
                       "eps": cfg.eps, "clip_norm": cfg.clip_norm, "schedule": cfg.schedule,
                       "precision": cfg.precision, "masking": "lmlab MaskedLM (exact 15% per "
                       "row, 80/10/10, sparse prediction)"}}


# ---------------------------------------------------------------------------------- reference
def reference_config(args: argparse.Namespace, tokenizer: Any):
    """A ``BertConfig`` equal to our preset (sizes, activation, norms, dropout, init)."""
    from transformers import BertConfig

    from lmlab.models.presets import preset

    ours = preset("bert", args.size, vocab_size=len(tokenizer),
                  pad_token_id=tokenizer.pad_token_id)
    return BertConfig(vocab_size=ours.vocab_size, hidden_size=ours.hidden_size,
                      num_hidden_layers=ours.num_hidden_layers,
                      num_attention_heads=ours.num_attention_heads,
                      intermediate_size=ours.intermediate_size, hidden_act=ours.hidden_act,
                      hidden_dropout_prob=ours.hidden_dropout_prob,
                      attention_probs_dropout_prob=ours.attention_probs_dropout_prob,
                      max_position_embeddings=ours.max_position_embeddings,
                      type_vocab_size=ours.type_vocab_size, layer_norm_eps=ours.norm_eps,
                      initializer_range=ours.initializer_range, pad_token_id=ours.pad_token_id,
                      tie_word_embeddings=ours.tie_word_embeddings, attn_implementation="sdpa")


def reference_optimizer(model: torch.nn.Module, args: argparse.Namespace) -> torch.optim.AdamW:
    """torch AdamW with transformers Trainer's decay exclusions: no decay for biases and
    LayerNorm parameters (the same split as ours: embeddings and matrices decay)."""
    no_decay = {name for module_name, module in model.named_modules()
                for param_name, _ in module.named_parameters(recurse=False)
                for name in [f"{module_name}.{param_name}" if module_name else param_name]
                if param_name == "bias" or isinstance(module, torch.nn.LayerNorm)}
    decay, exempt, seen = [], [], set()
    for name, parameter in model.named_parameters():
        if id(parameter) in seen:  # tied decoder weight = word embeddings: listed once
            continue
        seen.add(id(parameter))
        (exempt if name in no_decay else decay).append(parameter)
    groups = [{"params": decay, "weight_decay": args.weight_decay},
              {"params": exempt, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.999), eps=1e-6)


def reference_features(batch: dict[str, torch.Tensor], collator: Any) -> dict[str, torch.Tensor]:
    """Clean packed windows (B, T) -> the collator's masked features (padding removed first,
    so the collator pads and masks as it does for tokenized text)."""
    lengths = batch["attention_mask"].sum(dim=1).tolist()
    ids, types = batch["input_ids"], batch["token_type_ids"]
    examples = [{"input_ids": ids[row, :n].tolist(), "token_type_ids": types[row, :n].tolist()}
                for row, n in enumerate(lengths)]
    return collator(examples)


def reference_eval(model: torch.nn.Module, val: list[dict[str, torch.Tensor]]) -> float:
    """The reference's MLM loss on our fixed-mask validation batches: the mean over every masked
    position, each batch's mean weighted by its masked positions, as our Trainer evaluates."""
    model.eval()
    total = count = 0.0
    with torch.no_grad():
        for batch in val:
            masked = float((batch["labels"] != -100).sum())
            total += masked * float(model(input_ids=batch["input_ids"],
                                          attention_mask=batch["attention_mask"],
                                          token_type_ids=batch["token_type_ids"],
                                          labels=batch["labels"]).loss)
            count += masked
    model.train()
    return total / count


def reference_loop() -> str:
    """``"trainer"`` when transformers' Trainer can run (it needs accelerate), else
    ``"plain"``."""
    try:
        import accelerate  # noqa: F401
    except ImportError:
        return "plain"
    return "trainer"


def run_reference(args: argparse.Namespace, shards: Path, tokenizer_dir: Path, special: Any,
                  tokenizer: Any, val: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
    """transformers' BertForMaskedLM for ``budget`` seconds of training time on the same
    windows, masked by DataCollatorForLanguageModeling, evaluated on our fixed-mask batches:
    through transformers' Trainer when it can run, else the equivalent hand-written loop."""
    from transformers import AutoTokenizer, BertForMaskedLM, DataCollatorForLanguageModeling

    from lmlab.data.pretraining import PretrainingStream
    from lmlab.training.trainer import seed_everything

    hf_tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    if len(hf_tokenizer) != special.vocab_size or hf_tokenizer.mask_token_id != special.mask_id:
        raise LmlabError(f"transformers reads {tokenizer_dir} as a {len(hf_tokenizer)}-token "
                         f"vocabulary (mask id {hf_tokenizer.mask_token_id}), lmlab as "
                         f"{special.vocab_size} (mask id {special.mask_id})",
                         "pass --tokenizer with the Hugging Face-style folder the shards record")
    seed_everything(args.seed)
    model = BertForMaskedLM(reference_config(args, tokenizer)).train()

    def windows() -> Any:
        return iter(PretrainingStream(shards, split="train", objective=PassThrough(special),
                                      batch_size=args.batch_size, seq_len=args.seq_len,
                                      seed=args.seed))

    def collator() -> Any:  # a fresh masking RNG for each use
        return DataCollatorForLanguageModeling(hf_tokenizer, mlm_probability=0.15,
                                               seed=args.seed)

    # plan the schedule's length from the step time of a throwaway copy (not on the clock)
    scratch = copy.deepcopy(model)
    scratch_opt = reference_optimizer(scratch, args)
    scratch_windows, scratch_collator, times = windows(), collator(), []
    for index in range(CALIBRATION_STEPS + 1):
        started = time.perf_counter()
        features = reference_features(next(scratch_windows), scratch_collator)
        scratch(**features).loss.backward()
        torch.nn.utils.clip_grad_norm_(scratch.parameters(), args.clip_norm)
        scratch_opt.step()
        scratch_opt.zero_grad(set_to_none=True)
        if index:
            times.append(time.perf_counter() - started)
    del scratch, scratch_opt, scratch_windows
    step_time = statistics.median(times)
    planned = max(1, int(args.budget_seconds / step_time))
    warmup = int(math.ceil(args.warmup * planned))

    loop = reference_loop() if args.reference_loop == "auto" else args.reference_loop
    run = run_reference_trainer if loop == "trainer" else run_reference_plain
    result = run(args, model, windows, collator(), val, planned, warmup)
    result.update({
        "planned_steps": planned, "calibrated_step_seconds": round(step_time, 4),
        "warmup_steps": warmup, "attn_implementation": model.config._attn_implementation,
        "model_parameters": sum(p.numel() for p in model.parameters())})
    result["final_val_loss"] = result["curve"][-1][1]
    result["tokens_per_s"] = result["tokens"] / max(result["train_seconds"], 1e-9)
    result["config"] = {
        "lr": args.lr, "warmup_fraction": args.warmup, "weight_decay": args.weight_decay,
        "betas": [0.9, 0.999], "eps": 1e-6, "clip_norm": args.clip_norm,
        "schedule": "linear warmup + decay (transformers' get_linear_schedule_with_warmup)",
        "masking": "DataCollatorForLanguageModeling (Bernoulli 0.15, 80/10/10, "
                   "full-vocabulary logits)"}
    return result


def run_reference_plain(args: argparse.Namespace, model: torch.nn.Module, windows: Any,
                        collator: Any, val: list[dict[str, torch.Tensor]], planned: int,
                        warmup: int) -> dict[str, Any]:
    """The reference trained by the loop a user writes by hand (what Trainer does, minus its
    bookkeeping): AdamW, linear schedule, clipping, evaluation excluded from the clock."""
    from transformers import get_linear_schedule_with_warmup

    optimizer = reference_optimizer(model, args)
    scheduler = get_linear_schedule_with_warmup(optimizer, warmup, planned)
    batches = windows()
    clock, steps, tokens, eval_seconds = 0.0, 0, 0, 0.0
    curve: list[list[float]] = []
    next_eval = 0.0

    def evaluate() -> None:
        nonlocal eval_seconds, next_eval
        started = time.perf_counter()
        curve.append([round(clock, 3), reference_eval(model, val)])
        eval_seconds += time.perf_counter() - started
        while next_eval <= clock:
            next_eval += args.eval_every_seconds

    evaluate()
    stop_reason = "budget"
    while True:
        started = time.perf_counter()
        features = reference_features(next(batches), collator)
        loss = model(**features).loss
        loss.backward()
        loss_value = float(loss.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        clock += time.perf_counter() - started
        steps += 1
        tokens += int(features["attention_mask"].sum())
        if not math.isfinite(loss_value):
            raise LmlabError(f"the reference diverged at step {steps} (loss {loss_value})",
                             "lower --lr or lengthen --warmup")
        done = clock >= args.budget_seconds or steps >= planned
        if done:
            stop_reason = "budget" if clock >= args.budget_seconds else "planned_steps"
            evaluate()
            break
        if clock >= next_eval:
            evaluate()
    return {"loop": "plain loop (hand-written; transformers.Trainer not used)", "curve": curve,
            "steps": steps, "tokens": tokens, "train_seconds": round(clock, 3),
            "eval_seconds": round(eval_seconds, 2), "stop_reason": stop_reason}


class WindowRows(torch.utils.data.IterableDataset):
    """The clean packed windows as the examples a Trainer's data loader batches: one
    ``{"input_ids", "token_type_ids"}`` per row, padding removed, in the stream's order."""

    def __init__(self, windows: Any):
        self.windows = windows

    def __iter__(self) -> Any:
        for batch in self.windows():
            lengths = batch["attention_mask"].sum(dim=1).tolist()
            for row, n in enumerate(lengths):
                yield {"input_ids": batch["input_ids"][row, :n].tolist(),
                       "token_type_ids": batch["token_type_ids"][row, :n].tolist()}


def run_reference_trainer(args: argparse.Namespace, model: torch.nn.Module, windows: Any,
                          collator: Any, val: list[dict[str, torch.Tensor]], planned: int,
                          warmup: int) -> dict[str, Any]:
    """The reference trained by ``transformers.Trainer`` itself (its AdamW with decay
    exclusions, linear schedule, clipping, data loader), ``planned`` steps at most; a callback
    evaluates every ``eval_every_seconds`` of training time (evaluation off the clock) and
    stops training when the budget is spent."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    counted = {"tokens": 0}

    def collate(rows: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        features = collator(rows)
        counted["tokens"] += int(features["attention_mask"].sum())
        return features

    class BudgetCallback(TrainerCallback):
        """Training clock = wall time since train begin minus evaluation time."""

        def __init__(self) -> None:
            self.curve: list[list[float]] = []
            self.eval_seconds = 0.0
            self.next_eval = 0.0
            self.began = 0.0
            self.stop_reason = "planned_steps"
            self.steps = 0

        def clock(self) -> float:
            return time.perf_counter() - self.began - self.eval_seconds

        def evaluate(self, model: torch.nn.Module, clock: float) -> None:
            started = time.perf_counter()
            self.curve.append([round(clock, 3), reference_eval(model, val)])
            self.eval_seconds += time.perf_counter() - started
            while self.next_eval <= clock:
                self.next_eval += args.eval_every_seconds

        def on_train_begin(self, arguments, state, control, model=None, **kwargs):
            self.began = time.perf_counter()
            self.evaluate(model, 0.0)

        def on_step_end(self, arguments, state, control, model=None, **kwargs):
            clock = self.clock()
            self.steps = state.global_step
            if clock >= args.budget_seconds:
                self.stop_reason = "budget"
                control.should_training_stop = True
            elif clock >= self.next_eval:
                self.evaluate(model, clock)

        def on_train_end(self, arguments, state, control, model=None, **kwargs):
            self.train_seconds = self.clock()
            self.evaluate(model, self.train_seconds)

    callback = BudgetCallback()
    with tempfile.TemporaryDirectory(prefix="ttq-trainer-") as out:
        arguments = TrainingArguments(
            output_dir=out, max_steps=planned, per_device_train_batch_size=args.batch_size,
            learning_rate=args.lr, weight_decay=args.weight_decay, adam_beta1=0.9,
            adam_beta2=0.999, adam_epsilon=1e-6, max_grad_norm=args.clip_norm,
            lr_scheduler_type="linear", warmup_steps=warmup, seed=args.seed,
            use_cpu=True, save_strategy="no", eval_strategy="no", logging_strategy="no",
            report_to="none", disable_tqdm=True, dataloader_num_workers=0,
            remove_unused_columns=False)
        trainer = Trainer(model=model, args=arguments, train_dataset=WindowRows(windows),
                          data_collator=collate, callbacks=[callback])
        optimizer_name = str(arguments.optim)
        trainer.train()
    last = callback.curve[-1][1]
    if not math.isfinite(last):
        raise LmlabError(f"the reference diverged (validation loss {last})",
                         "lower --lr or lengthen --warmup")
    return {"loop": "transformers.Trainer", "optimizer": optimizer_name,
            "curve": callback.curve, "steps": callback.steps, "tokens": counted["tokens"],
            "train_seconds": round(callback.train_seconds, 3),
            "eval_seconds": round(callback.eval_seconds, 2),
            "stop_reason": callback.stop_reason}


# ------------------------------------------------------------------------------------- output
def plot(result: dict[str, Any], path: Path) -> None:
    """Both validation curves, loss against training minutes, into a PNG (written atomically)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lmlab.utils.io import atomic_path

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for name, style in (("ours", "o-"), ("reference", "s--")):
        side = result[name]
        xs = [seconds / 60 for seconds, _ in side["curve"]]
        ys = [loss for _, loss in side["curve"]]
        label = (f"{name}: {side['loop'].split(' (')[0]}, final {side['final_val_loss']:.3f}, "
                 f"{side['tokens_per_s']:,.0f} tok/s")
        axes.plot(xs, ys, style, markersize=3, label=label)
    settings = result["settings"]
    axes.set_xlabel("training wall time (minutes, evaluation excluded)")
    axes.set_ylabel("validation MLM loss (fixed masks)")
    axes.set_title(f"bert-{settings['size']} time to quality: {settings['budget_seconds']:.0f} s "
                   f"each, {settings['threads']} threads")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    env = result["environment"]
    figure.text(0.01, 0.01, f"{env['cpu']}; torch {env['torch']}, transformers "
                f"{env.get('transformers', '?')}", fontsize=6, alpha=0.7)
    figure.tight_layout(rect=(0, 0.03, 1, 1))
    with atomic_path(path) as tmp:
        figure.savefig(tmp, format="png", dpi=120)
    plt.close(figure)


def summary(result: dict[str, Any]) -> str:
    """One line: final losses, their ratio, and who reaches the other's final loss when."""
    ours, ref = result["ours"], result["reference"]
    line = (f"final val loss: ours {ours['final_val_loss']:.4f}, reference "
            f"{ref['final_val_loss']:.4f}, ours/reference {result['final_loss_ratio']:.3f}; "
            f"tokens/s ours {ours['tokens_per_s']:,.0f}, reference {ref['tokens_per_s']:,.0f}")
    reach = result["reference_reaches_our_final_at_s"]
    line += ("; the reference reaches our final loss at "
             f"{reach:.0f} s" if reach is not None else
             "; the reference does not reach our final loss within its budget")
    ours_reach = result["ours_reaches_reference_final_at_s"]
    if ours_reach is not None:
        line += f"; ours reaches the reference's final loss at {ours_reach:.0f} s"
    return line


def main(argv: list[str] | None = None) -> int:
    from lmlab.utils.durations import parse_duration

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", default=DEFAULT_SHARDS,
                        help="token-shard folder or glob (default: the demo's shards)")
    parser.add_argument("--tokenizer", help="tokenizer folder (default: the one the shards "
                                            "record, checked by fingerprint)")
    parser.add_argument("--size", default="mini", help="bert preset size (default mini)")
    parser.add_argument("--budget", default="10m", help="training time per side (e.g. 10m)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--warmup", type=float, default=0.06, help="warmup fraction")
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--clip-norm", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every-seconds", type=float, default=30.0)
    parser.add_argument("--eval-batches", type=int, default=8,
                        help="fixed-mask validation batches (lmlab pretrain's default: 8)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reference-loop", choices=["auto", "trainer", "plain"],
                        default="auto", help="transformers.Trainer (auto: when accelerate is "
                                             "installed) or the hand-written loop")
    parser.add_argument("--order", choices=["ours-first", "reference-first"],
                        default="ours-first", help="which side runs first")
    parser.add_argument("--out", default="runs/time-to-quality", help="output folder")
    args = parser.parse_args(argv)
    args.budget_seconds = parse_duration(args.budget)
    if not 0.0 <= args.warmup < 1.0:
        raise LmlabError(f"--warmup {args.warmup} is not a fraction", "use e.g. 0.06")
    if args.eval_every_seconds <= 0:
        raise LmlabError("--eval-every-seconds must be positive", "use e.g. 30")
    os.environ.setdefault("LMLAB_NO_PROGRESS", "1")
    torch.set_num_threads(args.threads)
    if os.environ.get("GLIBC_TUNABLES") != RECOMMENDED_TUNABLES:
        print(f"warning: GLIBC_TUNABLES is not the Makefile's ({RECOMMENDED_TUNABLES}); "
              "launch with it for figures comparable to the docs", flush=True)

    from lmlab.data.pretraining import validation_batches
    from lmlab.objectives.registry import build_objective
    from lmlab.objectives.special_tokens import SpecialTokens
    from lmlab.training.pretrain import find_tokenizer

    shards = resolve_folder(args.shards, "shards")
    tokenizer, tokenizer_dir = find_tokenizer(
        shards, str(resolve_folder(args.tokenizer, "tokenizer")) if args.tokenizer else None)
    if not tokenizer_dir.is_dir():
        raise LmlabError(f"the tokenizer {tokenizer_dir} is not a folder",
                         "pass --tokenizer with a folder holding tokenizer.json")
    special = SpecialTokens.from_tokenizer(tokenizer)
    val = validation_batches(shards, objective=build_objective("mlm", special),
                             batch_size=args.batch_size, seq_len=args.seq_len, seed=1234,
                             max_batches=args.eval_batches)
    predictions = sum(int((b["labels"] != -100).sum()) for b in val)
    print(f"shards {shards}; tokenizer {tokenizer_dir} ({len(tokenizer)} tokens); "
          f"{len(val)} validation batches, {predictions} masked positions; budget "
          f"{args.budget_seconds:.0f} s per side; {args.threads} threads", flush=True)

    sides = {"ours": lambda: run_ours(args, shards, tokenizer, special, val),
             "reference": lambda: run_reference(args, shards, tokenizer_dir, special, tokenizer,
                                                val)}
    order = ["ours", "reference"] if args.order == "ours-first" else ["reference", "ours"]
    result: dict[str, Any] = {}
    for name in order:
        started = time.perf_counter()
        result[name] = sides[name]()
        side = result[name]
        print(f"{name}: {side['steps']} steps, {side['tokens']:,} tokens in "
              f"{side['train_seconds']:.1f} s ({side['tokens_per_s']:,.0f} tok/s), "
              f"final val loss {side['final_val_loss']:.4f}, {len(side['curve'])} evaluations "
              f"({time.perf_counter() - started:.0f} s wall)", flush=True)
    result["settings"] = {k: (str(v) if isinstance(v, Path) else v)
                          for k, v in vars(args).items()}
    result["settings"].update({"shards": str(shards), "tokenizer": str(tokenizer_dir),
                               "vocab_size": len(tokenizer), "validation_batches": len(val),
                               "validation_predictions": predictions})
    result["environment"] = environment()
    result["final_loss_ratio"] = (result["ours"]["final_val_loss"]
                                  / result["reference"]["final_val_loss"])
    result["reference_reaches_our_final_at_s"] = time_to_reach(
        result["reference"]["curve"], result["ours"]["final_val_loss"])
    result["ours_reaches_reference_final_at_s"] = time_to_reach(
        result["ours"]["curve"], result["reference"]["final_val_loss"])
    result["summary"] = summary(result)

    from lmlab.utils.io import atomic_write_json

    out = Path(args.out)
    atomic_write_json(out / "time_to_quality.json", result)
    plot(result, out / "time_to_quality.png")
    print(result["summary"])
    print(f"wrote {out / 'time_to_quality.json'} and {out / 'time_to_quality.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
