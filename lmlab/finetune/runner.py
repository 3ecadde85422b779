"""Fine-tune and evaluate: one seed, several seeds (median and spread), early stopping on the
dev metric, best-checkpoint selection, predictions and plots in the run directory.

A run directory ``runs/NAME`` holds ``model/`` (a Hugging Face folder with the task head and
the tokenizer; for the feature recipe the frozen encoder + ``feature_head.safetensors``),
``finetune.json`` (task, recipe, seed, history), ``metrics.json``, ``predictions-<split>.jsonl``
and ``confusion-<split>.png``. With several seeds each seed has ``seed-N/`` and the run directory
has ``summary.json`` (median and spread over seeds).

The loop reuses the Trainer's pieces (:mod:`lmlab.training.optim` AdamW groups with BERT's
decay exclusions, :class:`lmlab.training.schedules.Schedule`); it is its own loop because
fine-tuning needs per-epoch dev evaluation with early stopping, in-memory best weights and
ULMFiT's unfreezing between epochs. :class:`lmlab.finetune.objective.TaskObjective` +
:class:`lmlab.finetune.data.TaskStream` also run under :class:`lmlab.training.Trainer`.
"""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from lmlab.finetune import data as fdata
from lmlab.finetune.heads import (
    HEAD_FOR_TASK,
    MULTIPLE_CHOICE,
    QUESTION_ANSWERING,
    TOKEN_CLASSIFICATION,
    task_logits,
)
from lmlab.finetune.objective import TaskObjective
from lmlab.finetune.recipes import (
    FeatureClassifier,
    FeatureHead,
    Recipe,
    discriminative_groups,
    get_recipe,
    layer_features,
    unfreeze_to,
)
from lmlab.finetune.results import (
    confusion_matrix,
    plot_confusion,
    summarize_seeds,
    write_metrics,
    write_predictions,
)
from lmlab.tasks.sampling import sample_examples  # also imported from here by callers
from lmlab.tasks.types import Task
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import atomic_write_json
from lmlab.utils.precision import precision_autocast

RANDOM_PREFIX = "random:"


# -- loading -------------------------------------------------------------------------------------
def parse_model_source(source: str | Path, random_init: bool = False) -> tuple[Path, bool]:
    """``random:PATH`` (or ``random_init``) means PATH's architecture, randomly initialised."""
    text = str(source)
    if text.startswith(RANDOM_PREFIX):
        return Path(text[len(RANDOM_PREFIX):]), True
    return Path(text), random_init


def load_tokenizer(path: Path):
    from lmlab.models.auto import resolve_model_dir
    from lmlab.tokenization.tokenizer import Tokenizer

    return Tokenizer.from_pretrained(resolve_model_dir(path))


def load_model(source: str | Path, random_init: bool = False, seed: int = 0):
    """(model, tokenizer, folder): a checkpoint, or its architecture with random weights."""
    from lmlab.interop.hf import load_config
    from lmlab.models.auto import from_pretrained, resolve_model_dir
    from lmlab.models.model import LanguageModel

    path, random_init = parse_model_source(source, random_init)
    folder = resolve_model_dir(path)
    if random_init:
        config, family, hf = load_config(folder)
        torch.manual_seed(seed)
        heads = ()
        for arch in hf.get("architectures") or []:
            heads = family.architectures.get(arch, ())
        model = LanguageModel(config, heads=heads)
    else:
        model = from_pretrained(folder)
    return model, load_tokenizer(folder), folder


def check_head_matches(model, task: Task) -> Task:
    """The task as the fine-tuned head sees it: same head kind, the model's labels in the model's
    order. A task read from files knows only the labels its files hold (a dev file may lack a
    class); when they are a subset of the model's ``id2label`` the model's label list is used."""
    head = HEAD_FOR_TASK[task.type]
    if head not in model.heads:
        raise LmlabError(f"the model has no {head!r} head for the {task.type} task {task.name!r} "
                         f"(its heads: {', '.join(model.heads) or 'none'})",
                         f"fine-tune it first: lmlab finetune --task {task.name} --model ...")
    if head in (MULTIPLE_CHOICE, QUESTION_ANSWERING):
        return task
    width = int(model.config.extra.get("num_labels", 2))
    names = model.config.extra.get("id2label") or {}
    ours = [names.get(i, names.get(str(i))) for i in range(width)]
    named = task.type != "regression" and all(ours) and \
        not all(str(n).startswith("LABEL_") for n in ours)
    if named and list(task.labels) != ours and set(task.labels) <= set(ours):
        return replace(task, labels=ours)
    expected = 1 if task.type == "regression" else len(task.labels)
    if width != expected:
        raise LmlabError(f"the model's {head} head predicts {width} labels but task "
                         f"{task.name!r} has {expected}",
                         "evaluate a model fine-tuned on this task, or fine-tune with "
                         "--model pointing at the base model")
    if named and ours != list(task.labels):
        raise LmlabError(f"the model's labels {ours[:5]}... differ from the task's "
                         f"{list(task.labels)[:5]}...",
                         "evaluate on the task the model was fine-tuned on")
    return task


# -- prediction ------------------------------------------------------------------------------------
def _autocast(precision: str):
    return precision_autocast(precision, "cpu")


@torch.no_grad()
def predict(model, tokenizer, task: Task, split: str, batch_size: int = 64,
            max_length: int = 128, precision: str = "fp32", stride: int = 64,
            n_best: int = 20, max_answer_length: int = 30,
            null_threshold: float = 0.0) -> list[Any]:
    """Predictions for ``split`` in the form ``task.evaluate`` expects."""
    examples = task.split(split)
    return predict_examples(model, tokenizer, task, examples, batch_size, max_length, precision,
                            stride, n_best, max_answer_length, null_threshold, split=split)


@torch.no_grad()
def predict_examples(model, tokenizer, task: Task, examples, batch_size: int = 64,
                     max_length: int = 128, precision: str = "fp32", stride: int = 64,
                     n_best: int = 20, max_answer_length: int = 30,
                     null_threshold: float = 0.0, split: str = "eval") -> list[Any]:
    from lmlab.finetune.qa import decode_answers

    head = HEAD_FOR_TASK[task.type]
    features = fdata.encode_examples(task, examples, tokenizer, max_length, stride, split=split)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    model.eval()
    outputs: list[Any] = [None] * len(features)
    for indices, batch in fdata.eval_batches(features, batch_size, pad_id):
        batch.pop("labels", None)
        with _autocast(precision):
            logits = task_logits(model, head, batch).float()
        for row, index in enumerate(indices):
            outputs[index] = logits[row]
    if task.type == "regression":
        return [float(o.reshape(-1)[0]) for o in outputs]
    if task.type in ("classification", "pair-classification"):
        return [task.labels[int(o.argmax())] for o in outputs]
    if task.type == "multiple-choice":
        return [str(int(o.argmax())) for o in outputs]
    if head == TOKEN_CLASSIFICATION:
        predictions = []
        for feature, logits in zip(features, outputs):
            firsts = fdata.first_subtoken_positions(feature.extra["word_ids"])
            tags = []
            for word in range(feature.extra["num_words"]):
                position = firsts.get(word)  # words cut by truncation get "O"
                tags.append(task.labels[int(logits[position].argmax())] if position is not None
                            else "O")
            predictions.append(tags)
        return predictions
    windows = [{"example_index": f.example_index, "start_logits": o[:, 0].tolist(),
                "end_logits": o[:, 1].tolist(), "offsets": f.extra["offsets"]}
               for f, o in zip(features, outputs)]
    allow_null = any(not e.answers for e in examples if e.answers is not None)
    answers = decode_answers(windows, [e.context or "" for e in examples], n_best,
                             max_answer_length, allow_null, null_threshold)
    return [a["answer"] for a in answers]


# -- training --------------------------------------------------------------------------------------
def _subset(task: Task, max_train_examples: int | None) -> Task:
    if not max_train_examples:
        return task
    splits = dict(task.splits)
    splits["train"] = sample_examples(task.split("train"), max_train_examples)
    return Task(task.name, task.type, list(task.labels), list(task.metrics), splits,
                task.positive_label, task.description)


def _num_labels(task: Task) -> int:
    if task.type == "regression":
        return 1
    if task.type in ("qa", "multiple-choice"):
        return 2
    return len(task.labels)


def finetune(task: Task, model_source: str | Path, out_dir: str | Path, recipe: str = "bert",
             seed: int = 0, epochs: int | None = None, lr: float | None = None,
             batch_size: int | None = None, max_train_examples: int | None = None,
             budget_seconds: float | None = None, precision: str = "fp32",
             random_init: bool = False, layer: int | None = None, pooling: str | None = None,
             max_length: int | None = None, patience: int | None = None,
             eval_splits: tuple[str, ...] = ("dev", "test"), save_model: bool = True,
             show_progress: bool = True) -> dict[str, Any]:
    """Fine-tune ``model_source`` on ``task`` with a recipe; returns the run's result dict.

    The dev split's first metric (``task.metrics[0]``) is evaluated after every epoch; the best
    epoch's weights are kept (in memory) and restored at the end, and training stops after
    ``patience`` epochs without improvement. ``budget_seconds`` bounds the training time.
    """
    from lmlab.finetune.recipes import RECIPES
    from lmlab.finetune.settings import check_settings

    check_settings(epochs=epochs, lr=lr, batch_size=batch_size, max_length=max_length,
                   max_train_examples=max_train_examples, patience=patience,
                   budget_seconds=budget_seconds)
    if recipe not in RECIPES:
        raise LmlabError(f"unknown recipe {recipe!r}", f"use one of {', '.join(RECIPES)}")
    rec = get_recipe(recipe, epochs=epochs, lr=lr, batch_size=batch_size, pooling=pooling,
                     max_length=max_length, patience=patience)
    if recipe == "feature" and layer is not None:
        rec = replace(rec, layer=layer)
    task = _subset(task, max_train_examples)
    task.split("train")
    task.split("dev")
    if precision not in ("fp32", "bf16"):
        raise LmlabError(f"unknown precision {precision!r}", "use fp32 or bf16")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer, folder = load_model(model_source, random_init, seed)
    started = time.perf_counter()
    if rec.frozen_encoder:
        result = _train_feature(task, model, tokenizer, rec, seed, budget_seconds, precision,
                                show_progress)
    else:
        result = _train_full(task, model, tokenizer, rec, seed, budget_seconds, precision,
                             show_progress)
    result["train_seconds"] = time.perf_counter() - started
    result.update(task=task.name, recipe=rec.to_dict(), seed=seed, precision=precision,
                  model=str(model_source), random_init=parse_model_source(model_source,
                                                                          random_init)[1],
                  sizes={k: len(v) for k, v in task.splits.items()})
    predictor = result.pop("_predictor")
    for split in eval_splits:
        if split not in task.splits or not task.splits[split]:
            continue
        examples = task.splits[split]
        predictions = predictor(split)
        if all(_has_reference(task, e) for e in examples):
            result[split] = task.evaluate(split, predictions)
            refs = task.references(split)
        else:
            refs = None
        write_predictions(out / f"predictions-{split}.jsonl", [e.id for e in examples],
                          predictions, refs)
        if refs is not None and task.type in ("classification", "pair-classification"):
            matrix = confusion_matrix(predictions, refs, task.labels)
            result.setdefault("confusion", {})[split] = matrix
            plot_confusion(out / f"confusion-{split}.png", matrix, task.labels,
                           f"{task.name} {split} ({recipe}, seed {seed})")
    if save_model:
        saver = result.pop("_saver")
        saver(out / "model")
    else:
        result.pop("_saver")
    write_metrics(out / "metrics.json", {k: v for k, v in result.items() if k != "history"})
    atomic_write_json(out / "finetune.json", {k: v for k, v in result.items()
                                              if k != "confusion"})
    return result


def _has_reference(task: Task, example) -> bool:
    if task.type == "tagging":
        return example.tags is not None
    if task.type == "qa":
        return example.answers is not None
    return example.label is not None


def _select(task: Task) -> str:
    return task.metrics[0]


def _train_full(task: Task, model, tokenizer, rec: Recipe, seed: int,
                budget_seconds: float | None, precision: str,
                show_progress: bool) -> dict[str, Any]:
    from lmlab.training.optim import build_optimizer, set_lr
    from lmlab.training.schedules import Schedule, estimate_horizon
    from lmlab.training.trainer import seed_everything

    seed_everything(seed)
    objective = TaskObjective(task.type, _num_labels(task),
                              {i: label for i, label in enumerate(task.labels)}
                              if task.type not in ("regression", "qa") else None,
                              pooling=rec.pooling)
    for name in [h for h in model.heads if h != objective.head]:
        del model.heads[name]  # pretraining heads are not part of the fine-tuned model
    objective.prepare(model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    features = fdata.encode_examples(task, task.split("train"), tokenizer, rec.max_length,
                                     split="train")
    stream = fdata.TaskStream(features, rec.batch_size, pad_id, seed=seed)
    groups = discriminative_groups(model, rec.lr, rec.lr_decay, rec.weight_decay)
    optimizer = build_optimizer(groups, rec.lr, (0.9, 0.999), 1e-6 if rec.name == "bert"
                                else 1e-8, rec.weight_decay)
    schedule = Schedule(rec.schedule, None, rec.warmup_fraction, 0.0, 0.1, 32.0)
    steps_per_epoch = len(stream)
    max_steps = steps_per_epoch * rec.epochs
    metric = _select(task)
    best_score, best_state, best_epoch, bad_epochs = -math.inf, None, -1, 0
    history = []
    step, started, examples_seen, selection_seconds = 0, time.perf_counter(), 0, 0.0
    batches = iter(stream)
    bar = None
    if show_progress:
        from lmlab.utils.progress import progress

        bar = progress(desc=f"finetune {task.name}", total=max_steps, unit="step")
    stop = None
    for epoch in range(rec.epochs):
        if rec.gradual_unfreeze:
            unfreeze_to(model, epoch)
        model.train()
        loss_sum, loss_count = 0.0, 0
        for _ in range(steps_per_epoch):
            elapsed = time.perf_counter() - started
            horizon = estimate_horizon(step, 0, elapsed, max_steps, None, budget_seconds)
            set_lr(optimizer, schedule.factor(step, horizon))
            batch = next(batches)
            with _autocast(precision):
                result = objective.compute_loss(model, batch)
            if not math.isfinite(float(result.loss.detach())):
                raise LmlabError(f"fine-tuning diverged (loss {float(result.loss)}) at step "
                                 f"{step + 1}", "lower --lr or use --precision fp32")
            result.loss.backward()
            if rec.clip_norm:
                torch.nn.utils.clip_grad_norm_([p for p in model.parameters()
                                                if p.grad is not None], rec.clip_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            examples_seen += int(batch["input_ids"].shape[0])
            loss_sum += float(result.loss.detach())
            loss_count += 1
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss_sum / loss_count:.3f}", refresh=False)
            if budget_seconds is not None and time.perf_counter() - started >= budget_seconds:
                stop = "budget"
                break
        selecting = time.perf_counter()  # dev evaluation and the best-state copy: not training
        predictions = predict(model, tokenizer, task, "dev", max_length=rec.max_length,
                              precision=precision)
        scores = task.evaluate("dev", predictions)
        history.append({"epoch": epoch + 1, "step": step, "train_loss": loss_sum / max(1, loss_count),
                        **{f"dev_{k}": v for k, v in scores.items()}})
        if scores[metric] > best_score:
            best_score, best_epoch, bad_epochs = scores[metric], epoch + 1, 0
            best_state = copy.deepcopy(model.state_dict())
        else:
            bad_epochs += 1
        selection_seconds += time.perf_counter() - selecting
        if stop is None and bad_epochs >= rec.patience:
            stop = "early_stopping"
        if stop is not None:
            break
    if bar is not None:
        bar.close()
    train_seconds = time.perf_counter() - started
    if best_state is not None:
        model.load_state_dict(best_state)
    for parameter in model.parameters():
        parameter.requires_grad_(True)

    def predictor(split: str) -> list[Any]:
        return predict(model, tokenizer, task, split, max_length=rec.max_length,
                       precision=precision)

    def saver(path: Path) -> None:
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)

    return {"history": history, "best_epoch": best_epoch, "stop_reason": stop or "epochs",
            "steps": step, "selection_seconds": round(selection_seconds, 3),
            # training steps only: the per-epoch dev evaluation is not training throughput
            "train_examples_per_s": examples_seen / max(train_seconds - selection_seconds, 1e-9),
            "selected_by": f"dev {metric}", "_predictor": predictor, "_saver": saver}


def _train_feature(task: Task, model, tokenizer, rec: Recipe, seed: int,
                   budget_seconds: float | None, precision: str,
                   show_progress: bool) -> dict[str, Any]:
    """Frozen encoder: per-layer sentence vectors are computed once; a scalar mix (or one
    layer) + linear classifier is trained on them with early stopping on dev."""
    from lmlab.training.trainer import seed_everything

    if task.type not in ("classification", "pair-classification", "regression"):
        raise LmlabError(f"the feature recipe handles sentence tasks, not {task.type}",
                         "use --recipe bert or ulmfit for this task")
    seed_everything(seed)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    for name in list(model.heads):
        del model.heads[name]
    pooling = "cls" if rec.pooling in ("cls", "family") else "mean"

    def features_of(split: str) -> tuple[torch.Tensor, list[Any]]:
        examples = task.split(split)
        feats = fdata.encode_examples(task, examples, tokenizer, rec.max_length, split=split)
        _, vectors = layer_features(model, fdata.eval_batches(feats, 64, pad_id), pooling,
                                    precision)
        return vectors, [f.label for f in feats]

    started = time.perf_counter()
    x_train, y_train = features_of("train")
    x_dev, _ = features_of("dev")
    encode_seconds = time.perf_counter() - started
    regression = task.type == "regression"
    y = torch.tensor(y_train, dtype=torch.float if regression else torch.long)
    layers, hidden = x_train.shape[1], x_train.shape[2]
    layer = rec.layer if rec.layer is None or rec.layer >= 0 else layers + rec.layer
    head = FeatureHead(layers, hidden, _num_labels(task), layer)
    optimizer = torch.optim.AdamW(head.parameters(), lr=rec.lr, weight_decay=rec.weight_decay)
    generator = torch.Generator().manual_seed(seed)
    metric = _select(task)
    best_score, best_state, best_epoch, bad_epochs = -math.inf, None, -1, 0
    history: list[dict[str, Any]] = []
    stop = None

    def decode(logits: torch.Tensor) -> list[Any]:
        if regression:
            return [float(v) for v in logits.reshape(-1)]
        return [task.labels[int(i)] for i in logits.argmax(-1)]

    for epoch in range(rec.epochs):
        head.train()
        order = torch.randperm(len(y), generator=generator)
        for start in range(0, len(order), rec.batch_size):
            idx = order[start:start + rec.batch_size]
            logits = head(x_train[idx])
            loss = (torch.nn.functional.mse_loss(logits.squeeze(-1), y[idx]) if regression
                    else torch.nn.functional.cross_entropy(logits, y[idx]))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        head.eval()
        with torch.no_grad():
            scores = task.evaluate("dev", decode(head(x_dev)))
        history.append({"epoch": epoch + 1, **{f"dev_{k}": v for k, v in scores.items()}})
        if scores[metric] > best_score:
            best_score, best_epoch, bad_epochs = scores[metric], epoch + 1, 0
            best_state = copy.deepcopy(head.state_dict())
        else:
            bad_epochs += 1
        if bad_epochs >= rec.patience:
            stop = "early_stopping"
            break
        if budget_seconds is not None and time.perf_counter() - started >= budget_seconds:
            stop = "budget"
            break
    head.load_state_dict(best_state)
    head.eval()
    train_seconds = time.perf_counter() - started
    mix = (torch.softmax(head.mix.weights, 0).tolist() if head.mix is not None else None)

    def predictor(split: str) -> list[Any]:
        vectors = x_dev if split == "dev" else features_of(split)[0]
        with torch.no_grad():
            return decode(head(vectors))

    def saver(path: Path) -> None:
        # the encoder, its tokenizer and the head: the folder loads on its own (lmlab evaluate,
        # lmlab.from_pretrained, pipelines), wherever the base model was
        FeatureClassifier(model, head, pooling, list(task.labels),
                          rec.max_length).save_pretrained(path)
        tokenizer.save_pretrained(path)

    return {"history": history, "best_epoch": best_epoch, "stop_reason": stop or "epochs",
            "encode_seconds": encode_seconds, "scalar_mix": mix,
            "train_examples_per_s": len(y) * len(history) / max(train_seconds, 1e-9),
            "selected_by": f"dev {metric}", "_predictor": predictor, "_saver": saver}


# -- several seeds ---------------------------------------------------------------------------------
def finetune_seeds(task: Task, model_source: str | Path, out_dir: str | Path,
                   seeds: tuple[int, ...] = (0, 1, 2), **kwargs: Any) -> dict[str, Any]:
    """:func:`finetune` once per seed (``out_dir/seed-N``); writes ``summary.json`` with the
    median and the spread (max - min) of every dev and test metric."""
    out = Path(out_dir)
    runs = []
    for seed in seeds:
        result = finetune(task, model_source, out / f"seed-{seed}", seed=seed, **kwargs)
        runs.append(result)
    summary = {"task": task.name, "model": str(model_source), "seeds": list(seeds),
               "recipe": runs[0]["recipe"], "random_init": runs[0]["random_init"],
               "dev": summarize_seeds(runs, "dev"), "test": summarize_seeds(runs, "test"),
               "best_epochs": [r["best_epoch"] for r in runs],
               "train_seconds": [r["train_seconds"] for r in runs]}
    atomic_write_json(out / "summary.json", summary)
    return summary


# -- evaluation of a finished run --------------------------------------------------------------
def seed_runs(path: str | Path) -> list[tuple[int, Path]]:
    """The ``seed-N/`` run directories of a several-seed run, by seed (empty for one run)."""
    path = Path(path)
    if not path.is_dir() or (path / "model").exists():
        return []
    found = []
    for child in path.glob("seed-*"):
        suffix = child.name.removeprefix("seed-")
        if child.is_dir() and suffix.lstrip("-").isdigit():
            found.append((int(suffix), child))
    return sorted(found)


def evaluate(task: Task, model_source: str | Path, out_dir: str | Path | None = None,
             splits: tuple[str, ...] = ("dev",), precision: str = "fp32",
             batch_size: int = 64, max_length: int = 128) -> dict[str, Any]:
    """Metrics of a fine-tuned model (a run dir or a Hugging Face folder with a task head) on
    ``splits``; writes predictions, metrics and confusion plots into ``out_dir`` when given.

    A run with several seeds (``seed-N/`` folders) is evaluated seed by seed (their files go to
    ``out_dir/seed-N/``): ``result["seeds"]`` lists the seeds, ``result["per_seed"]`` holds each
    seed's result and ``result[split]`` the median and spread of every metric over the seeds,
    as in the ``summary.json`` of ``lmlab finetune --seeds``."""
    seeds = seed_runs(model_source)
    out = Path(out_dir) if out_dir is not None else None
    if not seeds:
        return _evaluate_run(task, model_source, out, splits, precision, batch_size, max_length)
    runs = [_evaluate_run(task, folder, out / folder.name if out is not None else None, splits,
                          precision, batch_size, max_length) for _, folder in seeds]
    result: dict[str, Any] = {"task": task.name, "model": str(model_source),
                              "seeds": [seed for seed, _ in seeds],
                              "per_seed": {str(seed): run for (seed, _), run in zip(seeds, runs)}}
    for split in splits:
        if any(split in run for run in runs):
            result[split] = summarize_seeds(runs, split)
    if out is not None:
        write_metrics(out / "eval-metrics.json", result)
    return result


def _evaluate_run(task: Task, model_source: str | Path, out: Path | None,
                  splits: tuple[str, ...], precision: str, batch_size: int,
                  max_length: int) -> dict[str, Any]:
    """:func:`evaluate` of one run (one seed) or model folder."""
    from lmlab.models.auto import resolve_model_dir

    folder = resolve_model_dir(model_source)
    model, tokenizer, _ = load_model(folder)
    task = check_head_matches(model, task)
    result: dict[str, Any] = {"task": task.name, "model": str(model_source)}
    started = time.perf_counter()
    count = 0
    for split in splits:
        examples = task.split(split)
        predictions = predict(model, tokenizer, task, split, batch_size, max_length, precision)
        count += len(examples)
        references = task.references(split) if all(_has_reference(task, e) for e in examples) \
            else None
        if references is not None:
            result[split] = task.evaluate(split, predictions)
        if out is not None:
            write_predictions(out / f"eval-predictions-{split}.jsonl", [e.id for e in examples],
                              predictions, references)
            if references is not None and task.type in ("classification", "pair-classification"):
                matrix = confusion_matrix(predictions, references, task.labels)
                plot_confusion(out / f"eval-confusion-{split}.png", matrix, task.labels,
                               f"{task.name} {split}")
    result["examples_per_s"] = count / max(time.perf_counter() - started, 1e-9)
    if out is not None:
        write_metrics(out / "eval-metrics.json", result)
    return result


def load_summary(path: str | Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)
