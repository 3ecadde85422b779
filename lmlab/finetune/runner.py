"""Fine-tune and evaluate on a task: one seed or several (median and spread), dev selection,
predictions and confusion plots in the run folder (docs/finetuning.md lists its files).
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from lmlab.cost.precision import auto_precision, precision_autocast
from lmlab.finetune import data as fdata
from lmlab.finetune.images import IMAGE_TASK, check_modality, images_hash, predict_images
from lmlab.finetune.pooling import resolve_pooling
from lmlab.finetune.recipes import Recipe, default_recipe, discriminative_groups, get_recipe
from lmlab.finetune.results import (
    confusion_matrix,
    plot_confusion,
    summarize_seeds,
    write_predictions,
)
from lmlab.finetune.settings import FinetuneConfig
from lmlab.finetune.train import RunOptions, TaskRun, plan_task, task_objective, train_task
from lmlab.interop.folders import adapter_folder, folder_kind, source_kind
from lmlab.interop.folders import load_model as load_checkpoint
from lmlab.interop.native import save_model
from lmlab.models.task_heads import (
    HEAD_FOR_TASK,
    MULTIPLE_CHOICE,
    QUESTION_ANSWERING,
    TOKEN_CLASSIFICATION,
    task_logits,
)
from lmlab.tasks.sampling import sample_examples  # also imported from here by callers
from lmlab.tasks.types import Task
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import atomic_write_json, stable_hash

RANDOM_PREFIX = "random:"


# -- loading -------------------------------------------------------------------------------------
def parse_model_source(source: str | Path, random_init: bool = False) -> tuple[Path, bool]:
    """``random:PATH`` (or ``random_init``) means PATH's architecture, randomly initialised."""
    text = str(source)
    if text.startswith(RANDOM_PREFIX):
        return Path(text[len(RANDOM_PREFIX):]), True
    return Path(text), random_init


def load_tokenizer(path: Path):
    """The folder's tokenizer; an image model's ImageProcessor."""
    from lmlab.finetune.images import image_processor, is_image_folder
    from lmlab.tokenization.characters import load_tokenizer as load_folder_tokenizer
    from lmlab.utils.catalog import resolve_model_dir

    folder = resolve_model_dir(path)
    return image_processor(folder) if is_image_folder(folder) else load_folder_tokenizer(folder)


def _architecture(source: str | Path):
    """The model's modules without its weights (on the meta device: no memory, no reading of
    the checkpoint's tensors), for measuring its layer shapes before training."""
    with torch.device("meta"):
        return load_model(source, random_init=True)[0]


def load_model(source: str | Path, random_init: bool = False, seed: int = 0):
    """(model, tokenizer, folder): a checkpoint, or its architecture with random weights."""
    from lmlab.interop.hf import load_config, saved_heads
    from lmlab.interop.native import is_native_folder, read_native_config
    from lmlab.models.model import LanguageModel
    from lmlab.utils.catalog import resolve_model_dir

    path, random_init = parse_model_source(source, random_init)
    folder = resolve_model_dir(path)
    from lmlab.adapt import load_adapter

    adapted = None if random_init else adapter_folder(folder)
    if adapted is not None:  # a run fine-tuned with --method: its adapter on its base model
        return load_adapter(adapted), load_tokenizer(adapted), adapted
    if random_init:
        from lmlab.interop.recurrent import build_model, is_recurrent_folder, read_recurrent_config

        if is_recurrent_folder(folder):  # AWD-LSTM / ELMo: the architecture, fresh weights
            config, saved_heads = read_recurrent_config(folder)
            tokenizer = load_tokenizer(folder)  # ELMo's characters come from its vocabulary
            torch.manual_seed(seed)
            return build_model(config, saved_heads, tokenizer=tokenizer).train(), tokenizer, folder
        if is_native_folder(folder):
            config, heads = read_native_config(folder)
        else:
            config, family, hf = load_config(folder)
            heads = saved_heads(family, hf)
        _refuse_encoder_decoder(config, folder)
        torch.manual_seed(seed)
        model = LanguageModel(config, heads=heads)
    elif folder_kind(folder) == "feature-run":  # a feature-based run: encoder + feature head
        from lmlab.finetune.feature_based import load_feature_classifier

        model = load_feature_classifier(folder)
    else:
        model = load_checkpoint(folder)
        _refuse_encoder_decoder(model.config, folder)
    return model, load_tokenizer(folder), folder


def _refuse_encoder_decoder(config, folder: Path) -> None:
    """Task heads sit on an encoder; an encoder-decoder learns a task as text to text."""
    if getattr(config, "is_encoder_decoder", False):
        raise LmlabError(f"{folder} is an encoder-decoder ({config.family}); lmlab finetune "
                         "puts task heads on encoders",
                         "train it text-to-text: lmlab seq2seq data --task TASK --out DATA, then "
                         f"lmlab seq2seq train --data DATA --init {folder} --steps N --out RUN")


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
@torch.no_grad()
def predict(model, tokenizer, task: Task, split: str, batch_size: int = 64,
            max_length: int = 128, precision: str = "fp32", stride: int = 64,
            n_best: int = 20, max_answer_length: int = 30, null_threshold: float = 0.0,
            examples: list | None = None) -> list[Any]:
    """Predictions for ``split`` (or for ``examples``, named ``split`` in errors) in the form
    ``task.evaluate`` expects."""
    from lmlab.finetune.qa import decode_answers

    examples = task.split(split) if examples is None else examples
    if task.type == IMAGE_TASK:  # tokenizer: the model's ImageProcessor
        return predict_images(model, tokenizer, task, examples, split, batch_size, precision)
    head = HEAD_FOR_TASK[task.type]
    features = fdata.encode_examples(task, examples, tokenizer, max_length, stride, split=split)
    pad_id = fdata.pad_id_of(tokenizer)
    model.eval()
    device = next(model.parameters()).device  # where fine-tuning left it (--device)
    outputs: list[Any] = [None] * len(features)
    for indices, batch in fdata.eval_batches(features, batch_size, pad_id):
        batch = {k: v.to(device) for k, v in batch.items() if k != "labels"}
        with precision_autocast(precision, device.type):
            logits = task_logits(model, head, batch).float().cpu()
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
    return replace(task, splits={**task.splits,
                                 "train": sample_examples(task.split("train"), max_train_examples)})


def finetune(task: Task, model_source: str | Path, out_dir: str | Path,
             config: FinetuneConfig | None = None, **settings: Any) -> dict[str, Any]:
    """Fine-tune ``model_source`` on ``task`` into the run folder ``out_dir``; returns the run's
    record (what ``finetune.json`` holds: dev history, best epoch, dev/test metrics, the recipe
    and why it was chosen, pooling, precision, cost).

    ``config`` (a :class:`~lmlab.finetune.settings.FinetuneConfig`), or its fields as keyword
    arguments (``recipe=``, ``epochs=``, ``lr=``, ``distil=``, ``method=`` ...), on top of it.
    docs/finetuning.md describes the recipes, dev selection, early stopping, exact resumption,
    ``precision="auto"`` and the run folder's files.
    """
    from lmlab.training.distributed import process_device

    cfg = FinetuneConfig(**settings) if config is None else replace(config, **settings)
    is_random = parse_model_source(model_source, cfg.random_init)[1]
    if not is_random:
        _refuse_wrapped(model_source)
    rec, recipe_reason = _recipe(cfg, is_random)
    _check_images(task, model_source, cfg, rec)
    process_device(cfg.device)  # --device cuda without a GPU: refused before any work
    precision, precision_reason = _precision(cfg, model_source, rec)
    task = _subset(task, cfg.max_train_examples)
    task.split("train")
    task.split("dev")
    if cfg.distil is not None:  # the teacher fits the task and the student: checked before work
        if rec.frozen_encoder:
            raise LmlabError("distillation trains the whole student; the feature recipe "
                             "freezes it", "use the bert recipe with a teacher")
        cfg.distil.check(task, model_source)
    if cfg.method is not None and (rec.frozen_encoder or rec.gradual_unfreeze):
        raise LmlabError(f"--method {cfg.method} decides what trains; the {rec.name} recipe "
                         "freezes or unfreezes layers itself", "use the bert recipe")
    out = Path(out_dir)
    if cfg.activation_checkpointing and rec.frozen_encoder:
        raise LmlabError("activation checkpointing recomputes the encoder's layers; the "
                         "feature recipe trains a head on frozen features",
                         "drop activation_checkpointing, or use the bert recipe")
    run = RunOptions(precision, cfg.device, cfg.budget_seconds, cfg.save_every,
                     cfg.show_progress, cfg.activation_checkpointing)
    started = time.perf_counter()
    if rec.frozen_encoder:
        from lmlab.finetune.feature_based import train_feature_based

        _prepare_out(out, cfg.overwrite, None)  # the settings: checked by train_feature_based
        model, tokenizer, _ = load_model(model_source, cfg.random_init, cfg.seed)
        trained = train_feature_based(task, model, tokenizer, rec, cfg.seed, out, run)
    else:
        trained = _train_full(task, model_source, rec, cfg, out, run)
    if not trained.main:  # torchrun: rank 0 alone scores and writes
        return trained.report
    result = {**trained.report, "train_seconds": time.perf_counter() - started,
              "task": task.name, "recipe": rec.to_dict(), "recipe_reason": recipe_reason,
              "seed": cfg.seed, "precision": precision, "precision_reason": precision_reason,
              "model": str(model_source), "random_init": is_random,
              "sizes": {k: len(v) for k, v in task.splits.items()}}
    if cfg.distil is not None:
        result["distil"] = cfg.distil.to_dict()
    for split in cfg.eval_splits:
        if task.splits.get(split):
            _score_run_split(task, split, trained.predict(split), out, result,
                             f"{task.name} {split} ({rec.name}, seed {cfg.seed})")
    if cfg.save_model:
        trained.save(out / "model")
    atomic_write_json(out / "metrics.json", {k: v for k, v in result.items() if k != "history"})
    atomic_write_json(out / "finetune.json", {k: v for k, v in result.items()
                                              if k != "confusion"})
    return result


def _check_images(task: Task, model_source: str | Path, cfg: FinetuneConfig,
                  rec: Recipe) -> None:
    """Image tasks for image models only, trained whole (no features, PEFT method or teacher)."""
    from lmlab.utils.catalog import resolve_model_dir

    check_modality(task, resolve_model_dir(parse_model_source(model_source)[0]))
    if task.type != IMAGE_TASK:
        return
    for given, what in ((rec.frozen_encoder, f"the {rec.name} recipe"),
                        (cfg.method is not None, f"--method {cfg.method}"),
                        (cfg.distil is not None, "distillation")):
        if given:
            raise LmlabError(f"{what} is not built for image tasks ({task.name})",
                             "fine-tune the whole model: --recipe bert or scratch")


def _refuse_wrapped(model_source: str | Path) -> None:
    """A quantised model or a PEFT run's adapter cannot be fine-tuned as it is."""
    kind = source_kind(parse_model_source(model_source)[0])
    if kind == "quantized":
        raise LmlabError(f"{model_source} is an int8-quantised model (lmlab quantize): its linear "
                         "layers hold no trainable weights", "fine-tune the fp32 model, then "
                         "quantise the result")
    if kind == "adapter":
        raise LmlabError(f"{model_source} is a parameter-efficient run's adapter (lmlab finetune "
                         "--method): fine-tuning it again would train its adapter alone and "
                         "save a plain model without it", "merge it first (lmlab adapter merge "
                         "SOURCE --out FOLDER, LoRA or BitFit) and fine-tune that, or fine-tune "
                         "its base model")


def _recipe(cfg: FinetuneConfig, is_random: bool) -> tuple[Recipe, str]:
    """The recipe with ``cfg``'s overrides (a PEFT method's learning rates where none is
    given), and why it was chosen."""
    lr, head_lr_multiplier, min_updates = cfg.lr, cfg.head_lr_multiplier, cfg.min_updates
    if cfg.epochs is not None and min_updates is None:
        min_updates = 0  # epochs given: exactly that many, unless a minimum is given too
    if cfg.method is not None:
        from lmlab.adapt import METHOD_DEFAULTS

        if is_random:
            raise LmlabError(f"--method {cfg.method} trains a few parameters on a pretrained "
                             "model; a random one would stay random", "drop --random-init")
        lr = lr if lr is not None else METHOD_DEFAULTS[cfg.method]["lr"]
        if head_lr_multiplier is None:
            head_lr_multiplier = METHOD_DEFAULTS[cfg.method]["head_lr_multiplier"]
    name, reason = cfg.recipe, "chosen by the caller"
    if name is None:
        name = default_recipe(is_random)
        reason = ("the default for a randomly initialised model" if is_random
                  else "the default for a pretrained model")
    rec = get_recipe(name, epochs=cfg.epochs, lr=lr, batch_size=cfg.batch_size,
                     pooling=cfg.pooling, max_length=cfg.max_length, patience=cfg.patience,
                     head_lr_multiplier=head_lr_multiplier, min_updates=min_updates,
                     head_hidden=cfg.head_hidden)
    if name == "feature" and cfg.layer is not None:
        rec = replace(rec, layer=cfg.layer)
    return rec, reason


def _precision(cfg: FinetuneConfig, model_source: str | Path, rec: Recipe) -> tuple[str, str]:
    """``cfg.precision``, or for ``auto`` bf16 where this host runs it measurably faster
    (:func:`lmlab.cost.precision.auto_precision`; torchrun: rank 0 decides for every rank)."""
    if cfg.precision != "auto":
        return cfg.precision, "chosen by the caller"
    from lmlab.training.distributed import broadcast_object, init_distributed, process_device

    dist_info = init_distributed(process_device(cfg.device))
    choice = (auto_precision(process_device(cfg.device).type,
                             model=_architecture(model_source),
                             tokens=rec.batch_size * rec.max_length)
              if dist_info.rank == 0 else None)
    return broadcast_object(choice, dist_info)


def _score_run_split(task: Task, split: str, predictions: list[Any], out: Path,
                     result: dict[str, Any], title: str) -> None:
    """Score ``split`` into ``result`` (metrics, confusion matrix, a collapse onto one class,
    with a warning) and write its predictions and plot into ``out``."""
    metrics, matrix = _score_split(task, split, predictions, out, "", title)
    if metrics is not None:
        result[split] = metrics
    if matrix is not None:
        result.setdefault("confusion", {})[split] = matrix
    collapsed = one_class_label(task, predictions)
    if collapsed is not None:
        result.setdefault("one_class", {})[split] = collapsed
        warnings.warn(f"{task.name}: the model predicts {collapsed!r} for every {split} "
                      "example: it collapsed onto one class. Try more updates "
                      "(--min-updates), a higher --lr or --head-lr-multiplier, or check "
                      "the labels of the training data.", OneClassWarning, stacklevel=3)


class OneClassWarning(UserWarning):
    """A fine-tuned classifier predicted the same label for every example of a split."""


def one_class_label(task: Task, predictions: list[Any]) -> str | None:
    """The label a classification split's predictions all share (a collapsed model), or None
    (more than one label, fewer than two examples, or not a classification task)."""
    if task.type not in ("classification", "pair-classification") or len(predictions) < 2:
        return None
    labels = {str(p) for p in predictions}
    return labels.pop() if len(labels) == 1 else None


def _prepare_out(out: Path, overwrite: bool, config: dict[str, Any] | None) -> None:
    """Before the model loads: :func:`~lmlab.training.run_dir.prepare_run_folder` (resume,
    refuse or start over; ``config=None``: the feature recipe checks its settings itself), then
    the folder exists."""
    from lmlab.training.run_dir import prepare_run_folder

    prepare_run_folder(out, overwrite, config, what="fine-tuning run")
    out.mkdir(parents=True, exist_ok=True)


def _has_reference(task: Task, example) -> bool:
    if task.type == "tagging":
        return example.tags is not None
    if task.type == "qa":
        return example.answers is not None
    return example.label is not None


def _score_split(task: Task, split: str, predictions: list[Any], out: Path | None, prefix: str,
                 title: str) -> tuple[dict[str, float] | None, list[list[int]] | None]:
    """Metrics and (classification) confusion matrix of ``split``'s predictions, None when
    some example has no reference; with ``out``, writes ``<prefix>predictions-<split>.jsonl``
    and the matrix as ``<prefix>confusion-<split>.png`` titled ``title``."""
    examples = task.split(split)
    references = None
    if all(_has_reference(task, e) for e in examples):
        references = task.references(split)
    metrics = task.evaluate(split, predictions) if references is not None else None
    matrix = None
    if references is not None and task.type in ("classification", "pair-classification"):
        matrix = confusion_matrix(predictions, references, task.labels)
    if out is not None:
        write_predictions(out / f"{prefix}predictions-{split}.jsonl", [e.id for e in examples],
                          predictions, references)
        if matrix is not None:
            plot_confusion(out / f"{prefix}confusion-{split}.png", matrix, task.labels, title)
    return metrics, matrix


def _train_full(task: Task, model_source: str | Path, rec: Recipe, cfg: FinetuneConfig,
                out: Path, run: RunOptions) -> TaskRun:
    """BERT / ULMFiT on the Trainer: every weight trains (ULMFiT: discriminative LRs, slanted
    triangular schedule, gradual unfreezing; a PEFT method: its own parameters), selected on
    dev per epoch; with ``cfg.distil``, the teacher's soft targets join the loss."""
    from lmlab.adapt import method_record
    from lmlab.finetune.hooks import Unfreezing
    from lmlab.training.run_dir import RunRecord, run_config
    from lmlab.training.trainer import seed_everything

    path, random_init = parse_model_source(model_source, cfg.random_init)
    seed, method, distil = cfg.seed, cfg.method, cfg.distil
    tokenizer = load_tokenizer(path)  # an image model: its ImageProcessor
    images = task.type == IMAGE_TASK
    plan = plan_task(task, tokenizer, rec, seed, run,
                     eps=1e-6 if rec.name.startswith("bert") else 1e-8)
    record = RunRecord(hparams={"task": task.name, "model_source": str(path),
                                "random_init": random_init, "recipe": rec.to_dict(),
                                "train_data": images_hash(plan.stream.examples)
                                if images else stable_hash([(f.input_ids, f.label)
                                                            for f in plan.features]),
                                "distil": distil.to_dict() if distil is not None else None,
                                **({"method": method_record(method, cfg.method_options)}
                                   if method else {})},
                       objective={"spec": "task", "heads": [HEAD_FOR_TASK[task.type]]},
                       data={"tokenizer_fingerprint": tokenizer.fingerprint()})
    _prepare_out(out, cfg.overwrite, run_config(plan.config, record))
    model, _, folder = load_model(path, random_init, seed)
    pooling, pooling_reason = (None, "an image head reads [CLS]") if images else \
        resolve_pooling(rec.pooling, folder, model.pooler is not None, random_init)
    if run.progress and rec.pooling == "auto" and not images:
        print(f"lmlab finetune: pooling {pooling}: {pooling_reason}", flush=True)
    seed_everything(seed)  # the new head's initial weights
    objective = task_objective(task, pooling)
    if rec.head_hidden:  # ULMFiT's batch-norm head layer (models.task_heads)
        model.config.extra["classifier_hidden"] = rec.head_hidden
    for name in [h for h in model.heads if h != objective.head]:
        del model.heads[name]  # pretraining heads are not part of the fine-tuned model
    objective.prepare(model)
    if getattr(model.heads[objective.head], "style", None) == "last-token" \
            and model.config.pad_token_id is None:  # transformers finds the last token by it
        model.config.pad_token_id = fdata.pad_id_of(tokenizer)
    if getattr(model.heads[objective.head], "masks_question", False) \
            and getattr(tokenizer, "sep_token_id", None) is not None:  # BigBird's QA class
        model.config.extra["sep_token_id"] = tokenizer.sep_token_id  # finds the question by it
    stream = None
    if distil is not None:  # the teacher's logits, once per training example, in the batches
        from lmlab.training.distributed import process_device

        stream, objective = distil.attach(task, plan.features, plan.stream, objective,
                                          fdata.pad_id_of(tokenizer), process_device(run.device),
                                          run.precision)
    if method is not None:  # only the method's parameters and the task head train
        from lmlab.adapt import apply_method

        apply_method(model, method, **(cfg.method_options or {}))

    def predictor(split: str) -> list[Any]:
        return predict(model, tokenizer, task, split, max_length=rec.max_length,
                       precision=run.precision)

    groups = discriminative_groups(model, rec.lr, rec.lr_decay, rec.weight_decay,
                                   rec.head_lr_multiplier)
    hooks = [Unfreezing(model, plan.steps_per_epoch, plan.epochs)] if rec.gradual_unfreeze \
        else []
    done = train_task(plan, model, objective, out, hooks=hooks, stream=stream,
                      evaluate_dev=lambda: task.evaluate("dev", predictor("dev")),
                      param_groups=groups, record=record)

    def saver(target: Path) -> None:
        if method is not None:  # the small adapter file, on top of the base model
            from lmlab.adapt import save_adapter

            save_adapter(model, target, base_model=folder, overwrite=True)
        else:
            save_model(model, target)  # Hugging Face format, or lmlab's where no family maps it
        tokenizer.save_pretrained(target)

    done.predict, done.save = predictor, saver
    done.extra.update({"pooling": pooling, "pooling_reason": pooling_reason,
                       "planned_epochs": plan.epochs,
                       **({"method": method_record(method, cfg.method_options)} if method else {}),
                       "trainable_parameters": sum(p.numel() for p in model.parameters()
                                                   if p.requires_grad)})
    return done


# -- several seeds ---------------------------------------------------------------------------------
def finetune_seeds(task: Task, model_source: str | Path, out_dir: str | Path,
                   seeds: tuple[int, ...] = (0, 1, 2), **kwargs: Any) -> dict[str, Any]:
    """:func:`finetune` once per seed (``out_dir/seed-N``); writes ``summary.json`` with the
    median and the spread (max - min) of every dev and test metric."""
    out = Path(out_dir)
    runs = [finetune(task, model_source, out / f"seed-{seed}", seed=seed, **kwargs)
            for seed in seeds]
    if os.environ.get("RANK", "0") != "0":  # torchrun: rank 0 alone scored the seeds
        return {}
    summary = {"task": task.name, "model": str(model_source), "seeds": list(seeds),
               "recipe": runs[0]["recipe"], "random_init": runs[0]["random_init"],
               "dev": summarize_seeds(runs, "dev"), "test": summarize_seeds(runs, "test"),
               "best_epochs": [r["best_epoch"] for r in runs],
               "one_class": {str(r["seed"]): r["one_class"] for r in runs if r.get("one_class")},
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
        atomic_write_json(out / "eval-metrics.json", result)
    return result


def _evaluate_run(task: Task, model_source: str | Path, out: Path | None,
                  splits: tuple[str, ...], precision: str, batch_size: int,
                  max_length: int) -> dict[str, Any]:
    """:func:`evaluate` of one run (one seed) or model folder."""
    from lmlab.utils.catalog import resolve_model_dir

    folder = resolve_model_dir(model_source)
    model, tokenizer, _ = load_model(folder)
    task = check_head_matches(model, task)
    result: dict[str, Any] = {"task": task.name, "model": str(model_source)}
    started = time.perf_counter()
    count = 0
    for split in splits:
        predictions = predict(model, tokenizer, task, split, batch_size, max_length, precision)
        count += len(predictions)
        metrics, _ = _score_split(task, split, predictions, out, "eval-", f"{task.name} {split}")
        if metrics is not None:
            result[split] = metrics
    result["examples_per_s"] = count / max(time.perf_counter() - started, 1e-9)
    if out is not None:
        atomic_write_json(out / "eval-metrics.json", result)
    return result

