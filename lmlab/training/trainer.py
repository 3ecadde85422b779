"""The one training loop: pretraining and fine-tuning (every recipe, through hooks) run on it.

AdamW with a schedule, accumulation, clipping, bf16, evaluation, atomic checkpoints and exact
resume; a step's loss is the mean over every prediction of its micro-batches and ranks.
docs/training.md tells the story.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from itertools import chain
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmlab.cost.precision import precision_autocast
from lmlab.models.core.transformer import Transformer
from lmlab.training import checkpoint as ckpt
from lmlab.training.config import TrainingConfig
from lmlab.training.distributed import (
    DistInfo,
    LossModule,
    RankSlice,
    all_reduce_sum,
    barrier,
    broadcast_object,
    gather_objects,
    init_distributed,
    process_device,
    wrap,
)
from lmlab.training.hooks import TrainerHook
from lmlab.training.metrics_log import MetricsWriter, truncate_metrics
from lmlab.training.optim import build_optimizer, layer_rate_groups, param_groups, set_lr
from lmlab.training.run_dir import RunRecord, check_resumable, run_config
from lmlab.training.schedules import Schedule, estimate_horizon
from lmlab.utils.errors import LmlabError
from lmlab.utils.host import describe_host
from lmlab.utils.io import atomic_write_json


@dataclass
class TrainResult:
    """How a run ended."""

    step: int
    tokens: int
    elapsed: float
    stop_reason: str
    last_loss: float | None
    last_eval: dict[str, float] = field(default_factory=dict)
    out_dir: Path | None = None
    checkpoint: Path | None = None
    cost: dict[str, Any] | None = None


def _to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    return {k: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v)
            for k, v in batch.items()}


def _count_tokens(batch: dict[str, Any]) -> int:
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor):
        if mask.dim() == 3:  # (B, T, T) per-document masks (clm separate_documents): a real
            return int(mask.diagonal(dim1=1, dim2=2).sum())  # token attends to itself
        return int(mask.sum())
    ids = batch.get("input_ids")
    return int(ids.numel()) if isinstance(ids, torch.Tensor) else 0


def weighted_means(parts: Iterable[tuple[float, dict[str, float]]],
                   prefix: str = "") -> dict[str, float]:
    """Each metric's mean over ``parts`` of (weight, metrics), weighted by prediction count (a
    part may lack a metric), named ``prefix + name``; every ``*_perplexity`` is the exp of its
    averaged ``*_loss`` (the exp of the mean loss, not the mean of per-batch exps)."""
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    for weight, metrics in parts:
        for key, value in metrics.items():
            sums[key] = sums.get(key, 0.0) + weight * value
            weights[key] = weights.get(key, 0.0) + weight
    out = {prefix + key: value / weights[key] for key, value in sums.items()}
    for key in [k for k in out if k.endswith("_perplexity")]:
        loss_key = key[: -len("perplexity")] + "loss"
        if loss_key in out:
            out[key] = math.exp(min(out[loss_key], 50.0))
    return out


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (all devices)."""
    import numpy as np

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


class Trainer:
    """Train ``model`` with ``objective`` on ``train_stream`` under ``cfg``, writing ``out_dir``.

    Args:
        objective: ``prepare(model)`` (optional) and ``compute_loss(model, batch)`` returning
            ``loss``, ``metrics`` and ``num_predictions``.
        train_stream: resumable batches (``state_dict``); under DDP *global* batches.
        param_groups: optimizer groups; default: decay / no-decay over model and objective.
        record: what ``config.json`` records beyond ``cfg``; resuming compares it.
        cost_settings: ``price_per_hour`` and ``grid_g_per_kwh`` for the cost report.
        save_model: write ``out_dir/model`` (False: the caller saves the model it selects).
    """

    def __init__(self, model: nn.Module, objective: nn.Module, train_stream: Any,
                 cfg: TrainingConfig, out_dir: str | Path,
                 eval_batches: Iterable[dict[str, torch.Tensor]] | None = None,
                 param_groups: list[dict[str, Any]] | None = None,
                 record: RunRecord | None = None, tokenizer_dir: str | Path | None = None,
                 track_cost: bool = True, measure_peak: bool = True,
                 cost_settings: dict[str, float] | None = None,
                 hooks: Iterable[TrainerHook] = (), save_model: bool = True):
        self.cfg = cfg
        self.out_dir = Path(out_dir)
        self.model = model
        self.objective = objective
        self.eval_batches = list(eval_batches) if eval_batches is not None else []
        self.custom_groups = param_groups
        self.record = record or RunRecord()
        self.tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir is not None else None
        self.track_cost = track_cost
        self.measure_peak = measure_peak
        self.cost_settings = dict(cost_settings or {})
        self.hooks = list(hooks)
        self.save_model = save_model
        if cfg.threads:
            torch.set_num_threads(int(cfg.threads))
        self.stacks = [m for m in model.modules() if isinstance(m, Transformer)]
        if cfg.activation_checkpointing and not self.stacks:
            raise LmlabError(f"activation_checkpointing recomputes Transformer layers, and this "
                             f"{type(model).__name__} has none", "turn activation_checkpointing off")
        self.device = process_device(cfg.device)
        self.dist: DistInfo = init_distributed(self.device)
        self.precision_reason = "chosen by the caller"
        if cfg.precision == "auto":  # bf16 where this host measurably runs it faster
            from lmlab.cost.precision import auto_precision

            # Rank 0 measures and decides; every rank trains in the precision it chose.
            choice = (auto_precision(self.device.type, model=model,
                                     tokens=cfg.batch_size * cfg.seq_len)
                      if self.dist.rank == 0 else None)
            precision, self.precision_reason = broadcast_object(choice, self.dist)
            self.cfg = cfg = replace(cfg, precision=precision)
            if cfg.progress:
                print(f"lmlab: precision {precision}: {self.precision_reason}", flush=True)
        self.stream = (RankSlice(train_stream, self.dist.rank, self.dist.world_size)
                       if self.dist.active else train_stream)
        self.schedule = Schedule(cfg.schedule, cfg.warmup_steps, cfg.warmup_fraction,
                                 cfg.min_lr_ratio, cfg.cut_frac, cfg.ratio)
        self.checkpoints_dir = self.out_dir / "checkpoints"
        self.step = 0
        self.tokens = 0
        self.elapsed_before = 0.0
        self.last_checkpoint: Path | None = None
        self.last_eval: dict[str, float] = {}
        self.last_loss: float | None = None
        self.stop_reason: str | None = None  # set when the run ends, before its last checkpoint
        self._setup_done = False
        self.step_flops = 0.0  # the last step's FLOPs, where the Trainer counts them
        self._writer: MetricsWriter | None = None  # rank 0's metrics.jsonl, while training
        self._tracker: Any = None  # this session's CostTracker (rank 0, when tracking cost)
        self._session = ""

    # -- setup ----------------------------------------------------------------------------------
    def _setup(self) -> None:
        cfg = self.cfg
        if self.dist.active and cfg.strategy == "fsdp" and self.custom_groups is not None:
            raise LmlabError("custom optimizer param_groups are not supported with FSDP",
                             "use the default groups or the ddp strategy")
        if hasattr(self.objective, "prepare"):
            self.objective.prepare(self.model)
        self.model.to(self.device)
        self.objective.to(self.device)
        if cfg.compile:
            self.model.compile()  # in place: parameter names and state_dict keys stay the same
        self.loss_module = LossModule(self.model, self.objective)
        strategy = "fsdp" if cfg.strategy == "fsdp" else "ddp"
        self.wrapped = wrap(self.loss_module, strategy, self.dist, self.device)
        self.fsdp = self.dist.active and strategy == "fsdp"
        groups = self.custom_groups or (
            layer_rate_groups(self.model, [self.objective], cfg.lr, cfg.lr_decay,
                              cfg.weight_decay) if cfg.lr_decay
            else param_groups([self.model, self.objective], cfg.weight_decay))
        self.optimizer = build_optimizer(groups, cfg.lr, cfg.betas, cfg.eps, cfg.weight_decay,
                                         cfg.optimizer)
        self.params = [p for g in self.optimizer.param_groups for p in g["params"]]
        self._resume()
        self._setup_done = True

    def _resume(self) -> None:
        path = ckpt.latest_checkpoint(self.checkpoints_dir)
        if path is None:
            seed_everything(self.cfg.seed + self.dist.rank)
            return
        check_resumable(self.out_dir, run_config(self.cfg, self.record))
        state = ckpt.read_state(path)
        model_state = ckpt.load_state(path / "model.safetensors")
        objective_file = path / "objective.safetensors"
        objective_state = ckpt.load_state(objective_file) if objective_file.is_file() else {}
        optimizer_state = ckpt.load_optimizer_state(path)
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_model_state_dict,
                set_optimizer_state_dict,
            )

            full = {f"model.{k}": v for k, v in model_state.items()}
            full.update({f"objective.{k}": v for k, v in objective_state.items()})
            options = StateDictOptions(full_state_dict=True)
            set_model_state_dict(self.wrapped, full, options=options)
            set_optimizer_state_dict(self.wrapped, self.optimizer, optimizer_state, options=options)
        else:
            ckpt.load_into(self.model, model_state, path)
            if objective_state:
                ckpt.load_into(self.objective, objective_state, path)
            self.optimizer.load_state_dict(optimizer_state)
        self.step = int(state["step"])
        self.tokens = int(state["tokens"])
        self.elapsed_before = float(state["elapsed"])
        self.last_eval = state.get("last_eval", {})
        self.last_loss = state.get("last_loss")
        if state.get("stream") is not None and hasattr(self.stream, "load_state_dict"):
            self.stream.load_state_dict(state["stream"])
        hook_states = state.get("hooks") or [{}] * len(self.hooks)
        for hook, hook_state in zip(self.hooks, hook_states):
            hook.load(path, hook_state)
        ckpt.restore_rng(path, state["rng"], self.dist.rank)
        self.last_checkpoint = path
        if self.dist.is_main:
            truncate_metrics(self.out_dir / "metrics.jsonl", self.step)
            print(f"lmlab: resuming from {path} (step {self.step}, {self.tokens:,} tokens)",
                  flush=True)

    def _write_config(self) -> None:
        sections = run_config(self.cfg, self.record)
        sections["world_size"] = self.dist.world_size
        sections["device"] = str(self.device)
        if self.cost_settings:
            sections["cost"] = self.cost_settings
        sections["host"] = describe_host()  # the machine of the newest session (reports show it)
        atomic_write_json(self.out_dir / "config.json", sections)

    # -- the step -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _padding_setting(self) -> Iterator[None]:
        """``cfg.skip_padding=False``: the stack computes padding positions too (a forward
        pre-hook on ``model.transformer``, removed afterwards)."""
        stack = getattr(self.model, "transformer", None)
        if self.cfg.skip_padding or stack is None:
            yield
            return

        def computes_padding(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            return args, {**kwargs, "skip_padding": False}

        handle = stack.register_forward_pre_hook(computes_padding, with_kwargs=True)
        try:
            yield
        finally:
            handle.remove()

    @contextlib.contextmanager
    def _activation_checkpointing(self) -> Iterator[None]:
        """``cfg.activation_checkpointing``: the model's stacks recompute each layer's
        activations in the backward pass instead of keeping them (for the training steps; the
        stacks' own setting afterwards)."""
        before = [stack.checkpoint_layers for stack in self.stacks]
        for stack in self.stacks:
            stack.checkpoint_layers = stack.checkpoint_layers or self.cfg.activation_checkpointing
        try:
            yield
        finally:
            for stack, setting in zip(self.stacks, before):
                stack.checkpoint_layers = setting

    def _forward(self, batch: dict[str, torch.Tensor], module: nn.Module | None = None):
        """(loss, metrics, predictions) of ``module`` (default: the wrapped LossModule, the
        LossModule itself in one process) on ``batch``, under the run's precision."""
        with precision_autocast(self.cfg.precision, self.device.type):
            return (self.wrapped if module is None else module)(batch)

    def _train_step(self, batches: Iterator[dict[str, Any]]
                    ) -> tuple[float, dict[str, float], int, float] | None:
        """One optimizer step over ``grad_accum`` micro-batches; returns (loss, metrics,
        global tokens, grad norm), or None when the stream has ended."""
        self.model.train()
        self.objective.train()
        weighted_loss, weight_sum, tokens, flops = 0.0, 0.0, 0, 0.0
        metric_parts: list[tuple[float, dict[str, float]]] = []  # (weight, metrics) per micro
        for micro in range(self.cfg.grad_accum):
            try:
                batch = _to_device(next(batches), self.device)
            except StopIteration:  # a finite stream ran out: drop the partial step
                self.optimizer.zero_grad(set_to_none=True)
                return None
            tokens += _count_tokens(batch)
            flops += self._seq2seq_flops(batch)
            last = micro == self.cfg.grad_accum - 1
            sync = contextlib.nullcontext()
            if self.dist.active and not last and hasattr(self.wrapped, "no_sync"):
                sync = self.wrapped.no_sync()  # DDP: all-reduce once, after the last micro-batch
            with sync:
                loss, metrics, count = self._forward(batch)
                weight = float(count) if count > 0 else 1.0
                (loss * weight).backward()
            weighted_loss += float(loss.detach()) * weight
            weight_sum += weight
            metric_parts.append((weight, {k: float(v) for k, v in metrics.items()}))
        # global mean over predictions: grads hold sum_i w_i grad(L_i) (averaged over ranks)
        weighted_loss, weight_sum, tokens_all, self.step_flops = all_reduce_sum(
            [weighted_loss, weight_sum, float(tokens), flops], self.dist, self.device)
        scale = self.dist.world_size / weight_sum
        for p in self.params:
            if p.grad is not None:
                p.grad.mul_(scale)
        # clip_grad_norm_ also returns the norm (max_norm=inf: measure without clipping);
        # under FSDP the grads are DTensors and the norm is reduced over ranks
        norm = torch.nn.utils.clip_grad_norm_(
            [p for p in self.params if p.grad is not None], self.cfg.clip_norm or math.inf)
        grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        # the metrics over every micro-batch and rank (gathered as objects: a part may lack one)
        metrics = weighted_means(chain.from_iterable(gather_objects(metric_parts, self.dist)))
        return weighted_loss / weight_sum, metrics, int(round(tokens_all)), grad_norm

    def _seq2seq_flops(self, batch: dict[str, Any]) -> float:
        """An encoder-decoder batch's FLOPs; 0 for other models (the tracker counts per token)."""
        config = getattr(self.model, "config", None)
        labels = batch.get("labels")
        if not getattr(config, "is_encoder_decoder", False) or not isinstance(labels,
                                                                            torch.Tensor):
            return 0.0
        from lmlab.cost.flops import seq2seq_step_flops

        return seq2seq_step_flops(config, _count_tokens(batch), batch["input_ids"].shape[-1],
                                  int((labels != -100).sum()), labels.shape[-1])

    # -- evaluation -----------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """Loss and metrics over the validation batches, weighted by predictions (RNG forked:
        evaluating never changes the training run)."""
        if not self.eval_batches:
            return {}
        if self.dist.active and not self.fsdp and not self.dist.is_main:
            return {}
        self.model.eval()
        self.objective.eval()
        parts: list[tuple[float, dict[str, float]]] = []
        devices = [self.device.index or 0] if self.device.type == "cuda" else []
        with torch.no_grad(), torch.random.fork_rng(devices=devices), self._padding_setting(), \
                self._averaged():
            for batch in self.eval_batches:
                loss, metrics, count = self._forward(_to_device(batch, self.device),
                                                     self.wrapped if self.fsdp else self.loss_module)
                # weighted by predictions, as training weights its micro-batches: the mean
                # over every predicted token of the validation set, not a mean of batch means
                parts.append((float(count) if count > 0 else 1.0,
                              {k: float(v) for k, v in {**metrics, "loss": loss}.items()}))
        out = weighted_means(parts, "eval_")
        if "eval_perplexity" not in out and self.objective.reports_perplexity:
            out["eval_perplexity"] = math.exp(min(out["eval_loss"], 50.0))
        if hasattr(self.optimizer, "observe") and self.optimizer.observe(out["eval_loss"]):
            out["eval_averaging_started"] = 1.0  # NT-ASGD's switch to averaged SGD
        self.model.train()
        self.objective.train()
        return out

    def _averaged(self) -> contextlib.AbstractContextManager:
        """NT-ASGD's averaged weights in the model inside the block (other optimisers: none)."""
        averaged = getattr(getattr(self, "optimizer", None), "averaged", None)
        return averaged() if averaged is not None else contextlib.nullcontext()

    # -- checkpoints ----------------------------------------------------------------------------
    def _full_states(self) -> tuple[dict, dict, dict]:
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                get_model_state_dict,
                get_optimizer_state_dict,
            )

            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            full = get_model_state_dict(self.wrapped, options=options)
            optim = get_optimizer_state_dict(self.wrapped, self.optimizer, options=options)
            # clones: the gathered tensors' storages are not readable by safetensors
            model_state = {k[len("model."):]: v.clone() for k, v in full.items()
                           if k.startswith("model.")}
            obj_state = {k[len("objective."):]: v.clone() for k, v in full.items()
                         if k.startswith("objective.")}
            return model_state, obj_state, optim
        return self.model.state_dict(), self.objective.state_dict(), self.optimizer.state_dict()

    def save_checkpoint(self) -> Path:
        """Write ``checkpoints/step-N`` atomically (every rank's RNG, the rest from rank 0)."""
        model_state, obj_state, optim_state = self._full_states()  # collective under FSDP
        tmp = self.checkpoints_dir / f"step-{self.step}.tmp"
        if self.dist.is_main:
            tmp = ckpt.staging_dir(self.checkpoints_dir, self.step)
        barrier(self.dist)
        rng_json = ckpt.write_rng(tmp, self.dist.rank)
        # every rank's python/numpy states, into state.json
        all_rng = {str(r): state for r, state in enumerate(gather_objects(rng_json, self.dist))}
        barrier(self.dist)
        final = self.checkpoints_dir / f"step-{self.step}"
        if self.dist.is_main:
            stream_state = (self.stream.state_dict() if hasattr(self.stream, "state_dict")
                            else None)
            state = {"step": self.step, "tokens": self.tokens, "elapsed": self.elapsed(),
                     "stream": stream_state, "rng": all_rng, "last_eval": self.last_eval,
                     "last_loss": self.last_loss, "world_size": self.dist.world_size,
                     "hooks": [hook.save(tmp) for hook in self.hooks]}
            if self.stop_reason is not None:
                state["stop_reason"] = self.stop_reason
            ckpt.write_checkpoint(tmp, model_state, obj_state, optim_state, state)
            final = ckpt.commit(tmp, self.cfg.keep_last)
            if self.stop_reason is None:  # the cost so far survives a kill after this point
                self._log_cost("running", step=self.step)
        barrier(self.dist)
        self.last_checkpoint = final
        return final

    # -- the loop -------------------------------------------------------------------------------
    def elapsed(self) -> float:
        """Seconds this run has trained, over all its sessions (what ``budget_seconds`` bounds)."""
        return self.elapsed_before + (time.perf_counter() - self._session_start)

    def _stop_reason(self, elapsed: float) -> str | None:
        cfg = self.cfg
        if cfg.max_steps is not None and self.step >= cfg.max_steps:
            return "max_steps"
        if cfg.max_tokens is not None and self.tokens >= cfg.max_tokens:
            return "max_tokens"
        if cfg.budget_seconds is not None and elapsed >= cfg.budget_seconds:
            return "budget"
        return None

    def _nan_error(self, loss: float, grad_norm: float) -> LmlabError:
        last = (f"the last good checkpoint is {self.last_checkpoint}" if self.last_checkpoint
                else "no checkpoint was written before it")
        what = f"loss {loss}" if not math.isfinite(loss) else f"gradient norm {grad_norm}"
        return LmlabError(
            f"training diverged: {what} at step {self.step + 1}; {last}",
            "lower --lr, lengthen --warmup, keep --clip-norm on or use fp32; rerunning on the "
            "same --out resumes from the last good checkpoint")

    def train(self) -> TrainResult:
        """Run to the first stop condition, then evaluate, checkpoint, save the model, report."""
        tracker = self._start_session()
        try:
            stop = self._run_steps(tracker)
        except BaseException as error:  # what the failed session spent stays on record
            if tracker is not None:
                tracker.stop()
                self._log_cost("failed", error=f"{type(error).__name__}: {error}"[:300])
            raise
        return self._end_session(stop, tracker)

    def _log_cost(self, status: str, **extra: Any) -> None:
        """This session's cost so far as its newest record in the run folder (rank 0)."""
        if self._tracker is not None:
            self._tracker.report().log_session(self.out_dir, self._session, status, **extra)

    def _start_session(self) -> Any:
        """Set up (once), write config.json, open metrics.jsonl and the cost tracker (rank 0)."""
        if not self._setup_done:
            self._setup()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if self.dist.is_main:
            self._write_config()
            self._writer = MetricsWriter(self.out_dir / "metrics.jsonl",
                                         self.out_dir / "tensorboard")
        tracker = self._cost_tracker() if self.dist.is_main else None
        self._tracker, self._session = tracker, uuid.uuid4().hex[:12]  # not the seeded RNGs
        self._session_start = time.perf_counter()
        return tracker

    def _run_steps(self, tracker: Any) -> str | None:
        """Optimizer steps until a limit, a hook or the end of the data stops the run; returns
        why it stopped."""
        cfg, main, writer = self.cfg, self.dist.is_main, self._writer
        elapsed = self.elapsed_before
        batches = iter(self.stream)
        bar = self._progress_bar() if main else None
        window = {"tokens": 0, "seconds": 0.0}
        record: dict[str, Any] | None = None  # the newest step's train record, until written
        stop = self._stop_reason(elapsed)
        for hook in self.hooks:  # a resumed run that a hook had stopped stays stopped
            stop = hook.on_train_start(self) or stop
        with self._padding_setting(), self._activation_checkpointing():
            try:
                while stop is None:
                    for hook in self.hooks:
                        hook.on_step_start(self)
                    horizon = estimate_horizon(self.step, self.tokens, elapsed, cfg.max_steps,
                                               cfg.max_tokens, cfg.budget_seconds)
                    lr = set_lr(self.optimizer, self.schedule.factor(self.step, horizon))
                    started = time.perf_counter()
                    outcome = self._train_step(batches)
                    if outcome is None:
                        stop = "end_of_data"
                        break
                    loss, metrics, tokens, grad_norm = outcome
                    self._optimizer_step(loss, grad_norm)
                    seconds = time.perf_counter() - started
                    elapsed = self._count_step(tokens, loss, seconds, window, tracker)
                    record = {"kind": "train", "step": self.step, "tokens": self.tokens,
                              "loss": loss, "lr": lr, "grad_norm": grad_norm,
                              "tokens_per_s": window["tokens"] / max(window["seconds"], 1e-9),
                              "elapsed": elapsed}
                    record.update({k: v for k, v in metrics.items() if k != "loss"})
                    if main and (self.step % cfg.log_every == 0 or self.step == 1):
                        writer.write(record)
                        record = None
                        window = {"tokens": 0, "seconds": 0.0}
                    if bar is not None:
                        self._update_bar(bar, loss, seconds, tokens, horizon)
                    stop = self._stop_reason(elapsed)
                    for hook in self.hooks:
                        stop = hook.on_step_end(self) or stop
                    if cfg.eval_every and self.step % cfg.eval_every == 0 and stop is None:
                        self.log_eval(self.evaluate())
                    if cfg.save_every and self.step % cfg.save_every == 0 and stop is None:
                        self.save_checkpoint()
            finally:
                if bar is not None:
                    bar.close()
        if main and record is not None:  # the last step, off the log interval: log it too
            writer.write(record)
        return stop

    def _optimizer_step(self, loss: float, grad_norm: float) -> None:
        """Apply the step's gradients; a non-finite loss or gradient is logged and refused."""
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            self.optimizer.zero_grad(set_to_none=True)
            if self._writer is not None:
                self._writer.write({"kind": "diverged", "step": self.step + 1, "loss": loss,
                                    "grad_norm": grad_norm})
            raise self._nan_error(loss, grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _count_step(self, tokens: int, loss: float, seconds: float, window: dict[str, float],
                    tracker: Any) -> float:
        """Count a finished step (tokens, throughput window, cost); returns the time trained,
        one value for every rank (the LR and the stop decision depend on it)."""
        self.step += 1
        self.tokens += tokens
        self.last_loss = loss
        window["tokens"] += tokens
        window["seconds"] += seconds
        if tracker is not None:  # at the stream's current length (BERT's schedule changes it)
            tracker.add_tokens(tokens, seq_len=getattr(self.stream, "seq_len", None),
                               flops=self.step_flops or None)
            side = getattr(self.objective, "side_flops", None)  # e.g. a teacher's
            if side is not None:
                tracker.add_side_flops(side(tokens, self.cfg.seq_len))
        elapsed = all_reduce_sum([self.elapsed()], self.dist, self.device)[0]
        return elapsed / self.dist.world_size

    def _end_session(self, stop: str | None, tracker: Any) -> TrainResult:
        """After the loop: hooks, the final evaluation and checkpoint, the model, cost, report."""
        main, writer = self.dist.is_main, self._writer
        for hook in self.hooks:
            hook.on_train_end(self)
        self.log_eval(self.evaluate())
        if main:  # what reports read as the run's end (the last train record may be older)
            writer.write({"kind": "end", "step": self.step, "tokens": self.tokens,
                          "elapsed": self.elapsed(), "stop_reason": stop or ""})
        self.stop_reason = stop
        self.save_checkpoint()
        cost = None
        if tracker is not None:
            tracker.stop()
            cost = tracker.report()
            cost.log_session(self.out_dir, self._session, "finished", stop_reason=stop or "",
                             step=self.step)
        if main:
            with self._averaged():  # NT-ASGD's model is its average
                self._finish(cost)
            writer.close()
            self._writer = None
        barrier(self.dist)
        return TrainResult(step=self.step, tokens=self.tokens, elapsed=self.elapsed(),
                           stop_reason=stop or "", last_loss=self.last_loss,
                           last_eval=self.last_eval, out_dir=self.out_dir,
                           checkpoint=self.last_checkpoint,
                           cost=cost.to_dict() if cost is not None else None)

    def log_eval(self, results: dict[str, float]) -> None:
        """Make ``results`` (``eval_*`` keys) the run's newest evaluation and log it; hooks call
        it with their own scores."""
        if results:
            self.last_eval = results
            if self._writer is not None:
                self._writer.write({"kind": "eval", "step": self.step, "tokens": self.tokens,
                                    "elapsed": self.elapsed(), **results})

    # -- progress, cost, final outputs ----------------------------------------------------------
    def _progress_bar(self):
        if not self.cfg.progress:
            return None
        from lmlab.utils.progress import progress

        return progress(desc="train", total=self.cfg.max_steps, unit="step", initial=self.step)

    def _update_bar(self, bar, loss: float, seconds: float, tokens: int, horizon: float) -> None:
        bar.update(1)
        remaining = max(0.0, horizon - self.step) * seconds if math.isfinite(horizon) else 0.0
        if self.cfg.budget_seconds is not None:
            remaining = min(remaining, max(0.0, self.cfg.budget_seconds - self.elapsed()))
        bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tokens / max(seconds, 1e-9):,.0f}",
                        eta=f"{remaining / 60:.1f}m", refresh=False)

    def _cost_tracker(self):
        if not self.track_cost:
            return None
        from lmlab.cost.report import CostTracker

        config = getattr(self.model, "config", None)
        if config is None:
            return None
        tracker = CostTracker(config, self.cfg.seq_len, precision=self.cfg.precision,
                              device=self.device.type, devices=self.dist.world_size,
                              head=getattr(self.objective, "flops_head", "none"),
                              measure_peak=self.measure_peak,
                              sparse_prediction_fraction=getattr(self.objective,
                                                                 "predicted_fraction", None),
                              **self.cost_settings)
        return tracker.start()

    def _finish(self, cost: Any) -> None:
        from lmlab.training.report import save_final_model, write_report

        model = self.model
        if self.fsdp:  # parameters are shards: rebuild a plain model from the full checkpoint
            model = type(self.model)(self.model.config, heads=list(self.model.heads.keys()),
                                     with_pooler=self.model.pooler is not None)
            ckpt.load_module(model, self.last_checkpoint / "model.safetensors")
        if self.save_model:
            save_final_model(model, self.out_dir / "model", self.tokenizer_dir)
        if cost is not None:
            cost.write(self.out_dir)
        write_report(self.out_dir)
