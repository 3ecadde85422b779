"""The demo job, stage by stage, sharing one wall-clock budget.

Budget: ``--budget`` (default 20 minutes) is the whole demo's. The data stages (corpus,
tokenizer, shards) are not budgeted (they take about two minutes on the default corpus here and
are cached); pretraining gets :data:`PRETRAIN_SHARE` of the budget and fine-tuning
:data:`FINETUNE_SHARE`, split evenly over its runs; the baseline, the analysis and the report
use what is left. The shares are fixed fractions of the budget (not of measured remaining
time), so a rerun computes the same stage inputs and reuses every finished stage.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lmlab.demo.stages import StageLog, StageRunner
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import atomic_write_json

PRETRAIN_SHARE = 0.45
FINETUNE_SHARE = 0.33

CONTEXT_EXAMPLES = {
    "broke": ["The vase broke.", "Dawn broke."],
    "crane": ["A crane caught a fish.", "A crane picked up the steel beam."],
}
FILL_MASK_EXAMPLES = [
    "In the beginning God created the heaven and the [MASK].",
    "The [MASK] of the Lord came unto him.",
    "A crane is a large [MASK] with a long neck.",
    "Paris is the [MASK] of France.",
    "He opened the [MASK] and walked into the room.",
]


@dataclass
class DemoConfig:
    """Everything that changes the demo's results (speed settings live apart: ``threads``)."""

    out: str = "runs/demo"
    budget: float = 1200.0
    sources: list[str] | None = None  # None: every installed offline source
    max_documents: int | None = None  # per source; for quick runs
    vocab_size: int = 8192
    family: str = "bert"
    size: str = "mini"
    objective: str = "mlm"
    seq_len: int = 128
    batch_size: int = 32
    pretrain_lr: float = 5e-4
    tasks: tuple[str, ...] = ("fortunes-topic", "wordnet-supersense")
    seeds: tuple[int, ...] = (0, 1, 2)
    finetune_lr: float = 1e-4
    finetune_epochs: int = 8
    finetune_batch_size: int = 32
    max_train_examples: int | None = None
    max_eval_examples: int | None = None
    neighbour_occurrences: int = 300
    fresh: bool = False
    threads: int | None = field(default=None, metadata={"speed": True})

    @property
    def pretrain_seconds(self) -> float:
        return PRETRAIN_SHARE * self.budget

    @property
    def finetune_seconds_per_run(self) -> float:
        runs = max(1, len(self.tasks) * len(self.seeds) * 2)
        return FINETUNE_SHARE * self.budget / runs

    def validate(self) -> None:
        """Check every setting before any stage runs: a typo in ``tasks`` must not cost the
        data stages and the pretraining first. Names are checked against the registries
        (tasks, sources, model presets, objectives), numbers against their ranges."""
        from lmlab.data.build import resolve_sources
        from lmlab.models.presets import preset
        from lmlab.objectives.registry import check_objective_spec
        from lmlab.tasks.builtin import BUILTIN_TASKS
        from lmlab.utils.checks import check_at_least, check_names

        if self.budget < 30:
            raise LmlabError(f"a budget of {self.budget:.0f} s is too small for the demo",
                             "give at least 30s (the default is 20m; about 2m makes a smoke run)")
        if not self.tasks:
            raise LmlabError("--tasks names no task", f"use some of: {', '.join(BUILTIN_TASKS)}")
        check_names(self.tasks, list(BUILTIN_TASKS), "--tasks", "task")
        if not self.seeds or any(isinstance(s, bool) or not isinstance(s, int)
                                 for s in self.seeds):
            raise LmlabError(f"--seeds {self.seeds!r} must be one or more whole numbers",
                             "write e.g. --seeds 0,1,2")
        if self.sources is not None:
            resolve_sources(self.sources)
        positions = preset(self.family, self.size).max_position_embeddings
        if self.seq_len > positions:
            raise LmlabError(f"seq_len {self.seq_len} exceeds the {self.family}-{self.size} "
                             f"model's {positions} positions", f"use {positions} or less")
        check_objective_spec(self.objective)
        check_at_least(self.vocab_size, 128, "--vocab-size")
        for option, value in (("--max-documents", self.max_documents),
                              ("--max-train-examples", self.max_train_examples),
                              ("--max-eval-examples", self.max_eval_examples),
                              ("--threads", self.threads)):
            check_at_least(value, 1, option)

    def result_settings(self) -> dict[str, Any]:
        values = asdict(self)
        for name in ("out", "fresh", "threads"):
            values.pop(name)
        return values


def _say(message: str) -> None:
    print(f"lmlab demo: {message}", flush=True)


def _subset_eval(task, count: int | None):
    from lmlab.finetune.runner import sample_examples
    from lmlab.tasks.types import Task

    if not count:
        return task
    splits = dict(task.splits)
    for split in ("dev", "test"):
        if split in splits:
            splits[split] = sample_examples(splits[split], count)
    return Task(task.name, task.type, list(task.labels), list(task.metrics), splits,
                task.positive_label, task.description)


def check_demo_folder(out: str | Path, overwrite: bool = False) -> None:
    """Refuse an ``out`` folder that holds something other than a demo (no ``stages/``)
    unless ``overwrite``: the demo then writes its stages and report beside what is there."""
    from lmlab.utils.checks import check_output_folder

    if not (Path(out) / "stages").is_dir():
        check_output_folder(out, overwrite, "demo")


def run_demo(config: DemoConfig, overwrite: bool = False) -> Path:
    """Run (or resume) the whole demo; returns the path of the markdown report.

    Every setting is checked (:meth:`DemoConfig.validate`) and ``config.out`` must be new, a
    demo folder, or ``overwrite`` given, before anything is computed or written.
    """
    config.validate()
    check_demo_folder(config.out, overwrite)
    import torch

    if config.threads:
        torch.set_num_threads(config.threads)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    log = StageLog()
    stages = StageRunner(out, fresh=config.fresh, log=log)
    started = time.perf_counter()
    settings = config.result_settings()

    # 1. the corpus, without the dev/test texts of the built-in tasks (build_corpus's default)
    def corpus_stage(folder: Path):
        from lmlab.data.build import build_corpus

        manifest = build_corpus(config.sources, folder / "corpus",
                                max_documents=config.max_documents)
        return {"words": manifest["total_words"], "documents": manifest["total_documents"],
                "excluded_texts": sum(e["texts"] for e in manifest["exclude"]),
                "excluded_words": manifest["excluded_words"],
                "excluded_documents": manifest["excluded_documents"]}

    _say("1/6 corpus, without the built-in tasks' dev/test texts")
    corpus_folder, corpus = stages.run(
        "corpus", {"sources": config.sources, "max_documents": config.max_documents,
                   "exclude": "builtin-tasks-dev-test-segments"}, corpus_stage)
    corpus_dir = corpus_folder / "corpus"

    # 2. tokenizer and shards
    def tokenizer_stage(folder: Path):
        from lmlab.tokenization.tokenizer import Tokenizer

        tokenizer = Tokenizer.train(corpus_dir, kind="wordpiece", vocab_size=config.vocab_size,
                                    show_progress=False)
        tokenizer.save_pretrained(folder / "tokenizer")
        return {"vocab_size": len(tokenizer), "fingerprint": tokenizer.fingerprint()}

    _say("2/6 WordPiece tokenizer and token shards")
    tok_folder, tok_info = stages.run("tokenizer", {"corpus": corpus_folder.name,
                                                    "vocab_size": config.vocab_size},
                                      tokenizer_stage)
    tokenizer_dir = tok_folder / "tokenizer"

    def shards_stage(folder: Path):
        from lmlab.data.shards import build_shards
        from lmlab.tokenization.tokenizer import Tokenizer

        manifest = build_shards(Tokenizer.from_pretrained(tokenizer_dir), corpus_dir,
                                folder / "shards")
        splits = manifest.get("splits", {})
        return {split: {"tokens": info["num_tokens"], "documents": info["num_documents"]}
                for split, info in splits.items()}

    shards_folder, shards = stages.run("shards", {"tokenizer": tok_info["fingerprint"],
                                                  "corpus": corpus_folder.name}, shards_stage)
    shards_dir = shards_folder / "shards"
    data_seconds = time.perf_counter() - started

    # 3. pretraining (resumable: the trainer continues from its last checkpoint)
    def pretrain_stage(folder: Path):
        from lmlab.cli import main as cli

        run = folder / "run"
        args = ["pretrain", "--family", config.family, "--size", config.size,
                "--objective", config.objective, "--shards", str(shards_dir),
                "--tokenizer", str(tokenizer_dir), "--out", str(run),
                "--budget", f"{config.pretrain_seconds:.0f}s", "--seq-len", str(config.seq_len),
                "--batch-size", str(config.batch_size), "--lr", str(config.pretrain_lr),
                "--warmup", "0.06", "--eval-every", "50", "--save-every", "50", "--seed", "0"]
        if config.threads:
            args += ["--threads", str(config.threads)]
        code = cli(args)
        if code:
            raise LmlabError(f"pretraining failed (exit {code})", f"see {run}/report.md")
        return {"run": str(run)}

    _say(f"3/6 pretraining a BERT-{config.size} with {config.objective} "
         f"({config.pretrain_seconds / 60:.1f} min)")
    pretrain_inputs = {"shards": shards_folder.name, "family": config.family, "size": config.size,
                       "objective": config.objective, "seq_len": config.seq_len,
                       "batch_size": config.batch_size, "lr": config.pretrain_lr,
                       "seconds": round(config.pretrain_seconds)}
    pretrain_folder, pretrain = stages.run("pretrain", pretrain_inputs, pretrain_stage,
                                           resumable=True)
    pretrained_model = Path(pretrain["run"]) / "model"

    # 4. fine-tuning: pretrained vs the same architecture randomly initialised, and TF-IDF
    from lmlab.tasks.builtin import load_builtin_task

    results: dict[str, dict[str, list[dict]]] = {}
    per_run = config.finetune_seconds_per_run
    _say(f"4/6 fine-tuning on {', '.join(config.tasks)} x seeds {list(config.seeds)} "
         f"({per_run:.0f} s per run), and the TF-IDF baseline")
    for task_name in config.tasks:
        task = _subset_eval(load_builtin_task(task_name, "cpu"), config.max_eval_examples)
        results[task_name] = {"pretrained": [], "random": [], "tfidf": []}
        for seed in config.seeds:
            for kind in ("pretrained", "random"):
                def finetune_stage(folder: Path, kind=kind, seed=seed, task=task):
                    from lmlab.finetune.runner import finetune

                    result = finetune(task, pretrained_model, folder / "run", recipe="bert",
                                      seed=seed, epochs=config.finetune_epochs,
                                      lr=config.finetune_lr,
                                      batch_size=config.finetune_batch_size,
                                      max_train_examples=config.max_train_examples,
                                      budget_seconds=per_run, random_init=kind == "random",
                                      save_model=False, show_progress=True)
                    return {"dev": result.get("dev"), "test": result.get("test"),
                            "best_epoch": result.get("best_epoch"),
                            "train_seconds": result.get("train_seconds")}

                _, result = stages.run(f"finetune-{task_name}-{kind}-seed{seed}", {
                    "model": pretrain_folder.name, "kind": kind, "seed": seed,
                    "task": task_name, "lr": config.finetune_lr,
                    "epochs": config.finetune_epochs, "batch": config.finetune_batch_size,
                    "max_train": config.max_train_examples, "max_eval": config.max_eval_examples,
                    "seconds": round(per_run)}, finetune_stage)
                results[task_name][kind].append(result)

            def baseline_stage(folder: Path, seed=seed, task=task):
                from lmlab.finetune.runner import _subset
                from lmlab.tasks.baseline import run_tfidf_baseline

                result = run_tfidf_baseline(_subset(task, config.max_train_examples), seed=seed)
                return {"dev": result.get("dev"), "test": result.get("test"),
                        "chosen": result.get("chosen")}

            _, result = stages.run(f"tfidf-{task_name}-seed{seed}", {
                "task": task_name, "seed": seed, "max_train": config.max_train_examples,
                "max_eval": config.max_eval_examples}, baseline_stage)
            results[task_name]["tfidf"].append(result)

    # 5. what the pretrained model learned: contextual neighbours and fill-mask
    def analysis_stage(folder: Path):
        from lmlab.demo.analysis import contextual_examples, fill_mask_examples

        return {"neighbours": contextual_examples(pretrained_model, corpus_dir,
                                                  CONTEXT_EXAMPLES,
                                                  config.neighbour_occurrences),
                "fill_mask": fill_mask_examples(pretrained_model, FILL_MASK_EXAMPLES)}

    _say("5/6 contextual neighbours and fill-mask")
    _, analysis = stages.run("analysis", {"model": pretrain_folder.name,
                                          "examples": CONTEXT_EXAMPLES,
                                          "fill": FILL_MASK_EXAMPLES,
                                          "occurrences": config.neighbour_occurrences},
                             analysis_stage)

    # 6. the report (always rewritten: cheap, and it records this invocation's timings)
    _say("6/6 report")
    from lmlab.demo.report import write_report

    summary = {
        "settings": settings, "corpus": corpus, "tokenizer": tok_info, "shards": shards,
        "excluded_eval_texts": corpus["excluded_texts"], "pretrain_run": pretrain["run"],
        "results": results, "analysis": analysis, "stages": log.entries,
        "data_seconds": round(data_seconds, 1),
        "total_seconds": round(time.perf_counter() - started, 1),
    }
    atomic_write_json(out / "summary.json", summary)
    report = write_report(out, summary)
    _say(f"done in {summary['total_seconds'] / 60:.1f} min; report: {report}")
    return report


def load_summary(out: str | Path) -> dict[str, Any]:
    return json.loads((Path(out) / "summary.json").read_text())
