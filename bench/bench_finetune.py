"""Fine-tuning and evaluation throughput: lmlab against transformers' Trainer, same model.

Both sides fine-tune all-MiniLM-L6-v2 with a fresh sequence-classification head on the same
training examples of a built-in task, same batch size, one epoch, AdamW + linear schedule.
transformers runs at its best CPU settings for this: DataCollatorWithPadding (dynamic padding)
and train_sampling_strategy="group_by_length" (transformers 5's name for group_by_length),
through ``transformers.Trainer`` when ``accelerate`` is installed (it is in the dev extras);
lmlab uses length-grouped batches and padding skipping. Runs
alternate (ours, theirs, ours, theirs, ...) and the medians are printed with the ratio
ours/theirs. Evaluation throughput (dev predictions) and the dev metric after the epoch are
reported too; with --bf16 ours also runs under bf16 autocast (theirs stays fp32).

    OMP_NUM_THREADS=1 python bench/bench_finetune.py --examples 256 --reps 2
"""

from __future__ import annotations

import argparse
import copy
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def ours(task, model_dir: str, batch: int, precision: str, out: Path) -> dict:
    from lmlab.finetune.runner import evaluate, finetune

    started = time.perf_counter()
    result = finetune(task, model_dir, out, epochs=1, batch_size=batch, precision=precision,
                      show_progress=False, eval_splits=(), patience=99)
    total = time.perf_counter() - started
    # evaluate() times tokenising + predicting, after loading the model (as theirs is timed)
    scores = evaluate(task, out, None, ("dev",), precision=precision)
    return {"train_ex_s": result["train_examples_per_s"], "total_s": total,
            "eval_ex_s": scores["examples_per_s"], "dev": scores["dev"][task.metrics[0]]}


def theirs(task, model_dir: str, batch: int) -> dict:
    import numpy as np
    import torch
    import transformers
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
    )

    transformers.logging.set_verbosity_error()
    tok = AutoTokenizer.from_pretrained(model_dir)
    labels = {label: i for i, label in enumerate(task.labels)}
    model = AutoModelForSequenceClassification.from_pretrained(model_dir,
                                                               num_labels=len(task.labels))

    class Data(torch.utils.data.Dataset):
        def __init__(self, examples):
            pairs = [e.text_pair for e in examples] if task.is_pair else None
            self.enc = tok([e.text for e in examples], pairs, truncation=True, max_length=128)
            self.labels = [labels[e.label] for e in examples]

        def __len__(self):
            return len(self.labels)

        def __getitem__(self, i):
            item = {k: v[i] for k, v in self.enc.items()}
            item["labels"] = self.labels[i]
            return item

    train = Data(task.split("train"))
    collator = DataCollatorWithPadding(tok)
    torch.manual_seed(0)
    loop, train_seconds = train_reference(model, train, collator, batch)

    # evaluation, timed from raw text as ours is (tokenising is part of it): batches of 64
    # sorted by length, which is faster than Trainer.predict's unsorted order
    model.eval()
    started = time.perf_counter()
    dev = Data(task.split("dev"))
    order = sorted(range(len(dev)), key=lambda i: len(dev.enc["input_ids"][i]))
    predictions = []
    with torch.inference_mode():
        for start in range(0, len(order), 64):
            rows = [{k: v for k, v in dev[i].items() if k != "labels"}
                    for i in order[start:start + 64]]
            predictions += model(**collator(rows)).logits.argmax(-1).tolist()
    eval_seconds = time.perf_counter() - started
    accuracy = float(np.mean(np.asarray(predictions) == np.asarray([dev.labels[i]
                                                                     for i in order])))
    return {"train_ex_s": len(train) / train_seconds, "total_s": train_seconds,
            "eval_ex_s": len(dev) / eval_seconds, "dev": accuracy, "loop": loop}


def train_reference(model, train, collator, batch: int) -> tuple[str, float]:
    """One epoch of the reference: transformers' ``Trainer`` (group_by_length sampling,
    DataCollatorWithPadding, AdamW, 10% warmup + linear decay, clipping at 1.0) when
    ``accelerate`` is installed, else the same loop built from transformers' own pieces.
    Returns which one ran and its training seconds (the epoch only, not the set-up)."""
    import torch

    try:
        import accelerate  # noqa: F401
    except ImportError:
        accelerate = None
    if accelerate is not None:
        from transformers import Trainer, TrainingArguments

        with tempfile.TemporaryDirectory(prefix="bench-ft-trainer-") as out:
            arguments = TrainingArguments(
                output_dir=out, per_device_train_batch_size=batch, num_train_epochs=1,
                learning_rate=5e-5, weight_decay=0.01, warmup_steps=0.1,
                lr_scheduler_type="linear", max_grad_norm=1.0,
                train_sampling_strategy="group_by_length", use_cpu=True,
                save_strategy="no", logging_strategy="no", eval_strategy="no",
                report_to="none", disable_tqdm=True, seed=0, dataloader_num_workers=0)
            trainer = Trainer(model=model, args=arguments, train_dataset=train,
                              data_collator=collator)
            started = time.perf_counter()
            trainer.train()
            return "transformers.Trainer", time.perf_counter() - started
    from transformers import get_linear_schedule_with_warmup
    from transformers.trainer_pt_utils import LengthGroupedSampler

    sampler = LengthGroupedSampler(batch, lengths=[len(x) for x in train.enc["input_ids"]])
    loader = torch.utils.data.DataLoader(train, batch_size=batch, sampler=sampler,
                                         collate_fn=collator)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01)
    schedule = get_linear_schedule_with_warmup(optimizer, int(0.1 * len(loader)), len(loader))
    model.train()
    started = time.perf_counter()
    for inputs in loader:
        model(**inputs).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
    return ("Trainer's loop from transformers' pieces (accelerate not installed)",
            time.perf_counter() - started)


def profile(task, model_dir: str, batch: int) -> None:
    """Self CPU time per training step by kind of operator, one epoch per side (ours with a
    32-example dev split, so its per-epoch model selection adds little)."""
    import os
    import sys

    from lmlab.finetune.runner import finetune, sample_examples

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_pretrain import print_profiles, profile_side

    steps = -(-len(task.split("train")) // batch)
    small = copy.copy(task)
    small.splits = dict(task.splits, dev=sample_examples(task.splits["dev"], 32))
    with tempfile.TemporaryDirectory(prefix="bench-ft-profile-") as out:
        ours_profile = profile_side(
            lambda: finetune(small, model_dir, out, epochs=1, batch_size=batch,
                             show_progress=False, eval_splits=(), patience=99), steps)
    print_profiles(f"fine-tuning {task.name}, batch {batch}", {
        "reference-fp32": profile_side(lambda: theirs(task, model_dir, batch), steps),
        "ours-fp32": ours_profile})


def main() -> None:
    import torch

    from lmlab.finetune.runner import _subset, sample_examples
    from lmlab.tasks import load_builtin_task
    from lmlab.utils.catalog import minilm_dir

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--task", default="wordnet-supersense")
    parser.add_argument("--examples", type=int, default=256)
    parser.add_argument("--dev-examples", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--bf16", action="store_true", help="also time ours under bf16")
    parser.add_argument("--profile", action="store_true",
                        help="instead of timing, profile one epoch of each side by operator")
    args = parser.parse_args()
    model_dir = str(minilm_dir())
    task = _subset(load_builtin_task(args.task, "cpu"), args.examples)
    task.splits["dev"] = sample_examples(task.splits["dev"], args.dev_examples)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, task {args.task}, "
          f"{args.examples} train / {args.dev_examples} dev examples, batch {args.batch_size}")
    if args.profile:
        profile(task, model_dir, args.batch_size)
        return
    rows: dict[str, list[dict]] = {"ours fp32": [], "theirs fp32": []}
    if args.bf16:
        rows["ours bf16"] = []
    tmp = Path(tempfile.mkdtemp(prefix="bench-ft-"))
    try:
        for rep in range(args.reps):
            for name in rows:
                out = tmp / f"{name.replace(' ', '-')}-{rep}"
                if name.startswith("ours"):
                    row = ours(task, model_dir, args.batch_size, name.split()[1], out)
                else:
                    row = theirs(task, model_dir, args.batch_size)
                rows[name].append(row)
                print(f"rep {rep} {name}: " + ", ".join(
                    f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in row.items()), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {name: {k: statistics.median(r[k] for r in runs) for k in runs[0]
                  if isinstance(runs[0][k], float)} for name, runs in rows.items()}
    print(f"reference loop: {rows['theirs fp32'][0]['loop']}")
    print("\n| run | train ex/s | eval ex/s | dev " + task.metrics[0] + " |")
    print("|---|---|---|---|")
    for name, m in med.items():
        print(f"| {name} | {m['train_ex_s']:.1f} | {m['eval_ex_s']:.1f} | {m['dev']:.3f} |")
    base = med["theirs fp32"]
    for name, m in med.items():
        if name != "theirs fp32":
            print(f"{name} / theirs fp32: train {m['train_ex_s'] / base['train_ex_s']:.2f}x, "
                  f"eval {m['eval_ex_s'] / base['eval_ex_s']:.2f}x")


if __name__ == "__main__":
    main()
