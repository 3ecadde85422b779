"""ULMFiT's stages 2 and 3 (Howard & Ruder 2018) on lmlab's pretraining and fine-tuning, each
stage a run directory: :func:`finetune_lm` fine-tunes a general AWD-LSTM LM (stage 1, any
``lmlab pretrain --family awd-lstm`` run) on the task's own text; :func:`run_ulmfit` then
fine-tunes the classifier with the ``ulmfit`` recipe (docs/recurrent.md). Every stage resumes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lmlab.tasks.types import Task
from lmlab.utils.errors import LmlabError

LM_DIR, DATA_DIR, CLASSIFIER_DIR = "lm", "lm-data", "classifier"


def general_lm_folder(general: str | Path) -> Path:
    """The model folder of a stage-1 run (a run directory or a model folder), refused unless it
    holds an AWD-LSTM language model."""
    from lmlab.interop.recurrent import is_recurrent_folder, read_recurrent_config
    from lmlab.utils.catalog import resolve_model_dir

    folder = resolve_model_dir(general)
    if not is_recurrent_folder(folder):
        raise LmlabError(f"{general} is not an AWD-LSTM language model (ULMFiT's stages 2 and 3 "
                         "fine-tune one)", "pretrain one first: lmlab pretrain --family awd-lstm "
                         "--size mini --objective clm --shards SHARDS --out RUN")
    config, _ = read_recurrent_config(folder)
    if config.family != "awd-lstm":
        raise LmlabError(f"{general} is an {config.family} model; ULMFiT fine-tunes a left-to-right "
                         "AWD-LSTM language model", "pretrain one with --family awd-lstm "
                         "--objective clm (ELMo's layers are used as features: --recipe feature)")
    return folder


def _texts(task: Task, split: str) -> list[str]:
    """The task's texts of ``split`` without labels (a pair's two texts one after the other)."""
    texts = []
    for example in task.split(split):
        parts = [example.text, example.text_pair] if example.text is not None else \
            [" ".join(example.tokens or [])]
        texts.extend(part for part in parts if part)
    if not texts:
        raise LmlabError(f"task {task.name!r} has no text in its {split} split",
                         "ULMFiT's stage 2 needs the task's text: use a text task")
    return texts


def task_text_shards(task: Task, tokenizer_dir: Path, out: Path) -> Path:
    """Token shards of the task's text (train -> ``train``, dev -> ``validation``), one
    document per example, tokenized with the general LM's tokenizer; resumable."""
    from lmlab.data.shards import build_shards
    from lmlab.tokenization.tokenizer import Tokenizer
    from lmlab.utils.io import atomic_write_text

    corpus = out / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    for split, name in (("train", "train"), ("dev", "validation")):
        lines = [json.dumps({"id": f"{task.name}/{split}/{i}", "source": task.name,
                             "sentences": [text]}) for i, text in enumerate(_texts(task, split))]
        atomic_write_text(corpus / f"{name}.jsonl", "\n".join(lines) + "\n")
    shards = out / "shards"
    build_shards(Tokenizer.from_pretrained(tokenizer_dir), corpus, shards, show_progress=False)
    return shards


def finetune_lm(task: Task, general: str | Path, out: str | Path, steps: int, lr: float = 1e-3,
                batch_size: int = 32, seq_len: int = 70, seed: int = 0,
                precision: str = "fp32", show_progress: bool = False,
                lr_decay: float | None = None, ar: float = 0.0, tar: float = 0.0) -> Path:
    """Stage 2: continue the general LM's CLM training on the task's text for ``steps`` steps
    (slanted triangular rates; ``lr_decay``: discriminative rates ``lr / lr_decay**depth`` by
    layer group, the paper's 2.6; ``ar``/``tar``: AWD-LSTM's activation regularisation, 2 and 1
    in fastai), into the run directory ``out``; returns it. The train split's texts train, the
    dev split's measure perplexity; the test split's text is never read."""
    from lmlab.training.pretrain import PretrainConfig, pretrain

    folder = general_lm_folder(general)
    out = Path(out)
    shards = task_text_shards(task, folder, out.parent / DATA_DIR)
    pretrain(PretrainConfig.from_sections(
        None, init=str(folder), objective="clm", shards=str(shards), out=str(out),
        lr_decay=lr_decay, objective_args={"ar": ar, "tar": tar} if ar or tar else None,
        max_steps=steps, lr=lr, schedule="triangular", batch_size=batch_size, seq_len=seq_len,
        seed=seed, precision=precision, progress=show_progress, eval_every=max(steps // 4, 1),
        save_every=max(steps // 2, 1), track_cost=False))
    return out


def run_ulmfit(task: Task, general: str | Path, out: str | Path, *, lm_steps: int = 200,
               lm_lr: float = 1e-3, recipe: str = "ulmfit", seed: int = 0,
               precision: str = "fp32", show_progress: bool = False,
               lm_options: dict[str, Any] | None = None,
               **finetune_args: Any) -> dict[str, Any]:
    """Stages 2 and 3 into ``out/lm`` and ``out/classifier`` (``lm_steps=0``: stage 3 on the
    general LM directly; ``lm_options``: stage 2's ``lr_decay``, ``ar``, ``tar``;
    ``finetune_args``: stage 3's other settings, ``lr=``, ``epochs=``, ``head_hidden=`` ...).
    Returns stage 3's result with ``lm_eval``: stage 2's last evaluation (dev perplexity)."""
    from lmlab.finetune.runner import finetune
    from lmlab.training.report import run_summary

    general_lm_folder(general)  # refused before any work
    if lm_steps < 0:
        raise LmlabError(f"lm_steps {lm_steps} is negative", "use 0 to skip stage 2, or more")
    options = dict(lm_options or {})
    if options.get("lr_decay") is not None and not options["lr_decay"] >= 1:
        raise LmlabError(f"lm_lr_decay {options['lr_decay']} is below 1",
                         "use 2.6 (the paper's), or leave it unset for one rate")
    for name in ("ar", "tar"):
        if options.get(name, 0) < 0:
            raise LmlabError(f"lm {name} {options[name]} is negative",
                             f"use {name} >= 0 (AWD-LSTM: ar 2, tar 1)")
    out = Path(out)
    source: Path | str = general
    lm_eval: dict[str, Any] = {}
    if lm_steps:
        source = finetune_lm(task, general, out / LM_DIR, lm_steps, lm_lr,
                             seq_len=70, seed=seed, precision=precision,
                             show_progress=show_progress, **options)
        lm_eval = run_summary(source)["last_eval"]
    result = finetune(task, source, out / CLASSIFIER_DIR, recipe=recipe, seed=seed,
                      precision=precision, show_progress=show_progress, **finetune_args)
    result["lm_eval"] = lm_eval
    return result
