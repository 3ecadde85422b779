"""The user's alternative for docs/results.md: ``transformers.Trainer`` with its defaults.

``AutoModelForSequenceClassification`` from a checkpoint folder (a fresh classifier over the
[CLS] pooler, as transformers builds it) trained by ``transformers.Trainer`` with the default
``TrainingArguments`` (AdamW, lr 5e-5, 3 epochs, batch 8, linear decay, no warmup, no weight
decay, fp32, the model of the last step: no selection on dev), inputs cut at 128 tokens, one
seed per run. Only the seed and what does not change training are set (no checkpoints, no
logging integrations). Scored with the task's own metric functions (``task.evaluate``) on the
same dev and test splits as the lmlab systems. transformers is a reference here, never a
dependency of ``lmlab/``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from lmlab.tasks.types import Task
from lmlab.utils.errors import LmlabError

MAX_LENGTH = 128


def run_hf_trainer(task: Task, model_dir: str | Path, out_dir: str | Path, seed: int = 0,
                   **overrides: Any) -> dict[str, Any]:
    """Train and score one seed; returns ``{"dev": {...}, "test": {...}, "train_seconds",
    "steps", "one_class": {split: label}}``. ``overrides`` go to ``TrainingArguments``
    (the results page passes none; tests shorten the run)."""
    if task.type not in ("classification", "pair-classification"):
        raise LmlabError(f"the transformers.Trainer row handles classification tasks, not "
                         f"{task.type} ({task.name})", "leave hf-trainer out for this task")
    import numpy as np
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        Trainer,
        TrainingArguments,
        set_seed,
    )

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    labels = list(task.labels)
    index = {label: i for i, label in enumerate(labels)}

    def encode(split: str) -> list[dict[str, Any]]:
        rows = []
        for example in task.split(split):
            row = dict(tokenizer(example.text or "", example.text_pair, truncation=True,
                                 max_length=MAX_LENGTH))
            row["labels"] = index[example.label]
            rows.append(row)
        return rows

    args = TrainingArguments(output_dir=str(out_dir), seed=seed, data_seed=seed,
                             save_strategy="no", report_to="none", use_cpu=True,
                             disable_tqdm=True, logging_strategy="no", **overrides)
    set_seed(seed)  # the new classifier's initial weights
    model = AutoModelForSequenceClassification.from_pretrained(
        model_dir, num_labels=len(labels), id2label=dict(enumerate(labels)), label2id=index)
    trainer = Trainer(model=model, args=args, train_dataset=encode("train"),
                      processing_class=tokenizer)
    started = time.perf_counter()
    run = trainer.train()
    result: dict[str, Any] = {"train_seconds": time.perf_counter() - started,
                              "steps": run.global_step, "one_class": {}}
    for split in ("dev", "test"):
        logits = trainer.predict(encode(split)).predictions
        predictions = [labels[int(i)] for i in np.argmax(logits, axis=-1)]
        result[split] = task.evaluate(split, predictions)
        if len(set(predictions)) == 1:
            result["one_class"][split] = predictions[0]
    return result
