"""The demo job, stage by stage, sharing one wall-clock budget.

Budget: ``--budget`` (default 20 minutes) is the whole demo's. The data stages (corpus,
tokenizer, shards) are not budgeted (they take about two minutes on the default corpus here and
are cached); pretraining gets :data:`PRETRAIN_SHARE` of the budget, fine-tuning
:data:`FINETUNE_SHARE`, split evenly over its runs, and the ceiling model (MiniLM, one run per
task) :data:`CEILING_SHARE`; the baseline, the analysis and the report use what is left. The shares are fixed fractions of the budget (not of measured remaining
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
CEILING_SHARE = 0.08  # the ceiling model (MiniLM), one run per task
# the pretraining recipe chosen by the ablation in docs/demo.md (bench/ablation_demo_pretrain.py)
PRETRAIN_MODEL_ARGS = {"num_hidden_layers": 2, "hidden_dropout_prob": 0.0,
                       "attention_probs_dropout_prob": 0.0}
# the goal of the demo's pretraining (issue #13): this far below the unigram entropy, this accurate
GOAL_NATS_BELOW_UNIGRAM = 1.5
GOAL_ACCURACY = 0.25

def model_name(family: str, size: str) -> str:
    """How the demo names its model: ``RoFormer-mini``."""
    from lmlab.interop.families import KNOWN_FAMILIES, get_family

    name = get_family(family).display_name if family in KNOWN_FAMILIES else family
    return f"{name}-{size}"


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
    # BERT with rotary positions (RoFormer): it leaves the unigram plateau after a few hundred
    # updates where BERT's learned positions take about 6,000 (docs/demo.md)
    family: str = "roformer"
    size: str = "mini"
    objective: str = "mlm"
    seq_len: int = 128
    batch_size: int = 8  # many small updates: the plateau ends after steps, not tokens
    pretrain_lr: float = 1e-3
    pretrain_warmup: float = 0.06  # fraction of the pretraining time
    pretrain_schedule: str = "linear"
    mask_prob: float = 0.4  # Wettig et al. 2023; measured better here (docs/demo.md)
    model_args: dict[str, Any] = field(default_factory=lambda: dict(PRETRAIN_MODEL_ARGS))
    # pretraining and fine-tuning; "auto": bf16 where this host measurably runs it faster
    precision: str = "auto"
    tasks: tuple[str, ...] = ("fortunes-topic", "wordnet-supersense")
    seeds: tuple[int, ...] = (0, 1, 2)
    finetune_lr: float = 1e-4
    finetune_epochs: int = 8
    finetune_batch_size: int = 32
    # mean over the tokens: neither MLM-only pretraining nor MiniLM (sentence-transformers,
    # mean-pooled) trains the [CLS] pooler, so a head on it starts from noise
    finetune_pooling: str = "mean"
    ceiling: str | None = "minilm"  # a pretrained checkpoint fine-tuned as the ceiling row
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

    @property
    def ceiling_seconds_per_run(self) -> float:
        """The ceiling model gets one run (the first seed) per task."""
        return CEILING_SHARE * self.budget / max(1, len(self.tasks))

    def validate(self) -> None:
        """Check every setting before any stage runs: a typo in ``tasks`` must not cost the
        data stages and the pretraining first. Names are checked against the registries
        (tasks, sources, model presets, objectives), numbers against their ranges."""
        from lmlab.data.build import resolve_sources
        from lmlab.models.catalog import resolve_short_name
        from lmlab.models.presets import preset
        from lmlab.objectives.registry import check_objective_spec
        from lmlab.tasks.builtin import BUILTIN_TASKS
        from lmlab.training import TrainingConfig
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
        TrainingConfig(lr=self.pretrain_lr, warmup_fraction=self.pretrain_warmup,
                       schedule=self.pretrain_schedule, max_steps=1,
                       precision="fp32" if self.precision == "auto" else self.precision)
        preset(self.family, self.size, **self.model_args)
        if not 0.0 < self.mask_prob < 1.0:
            raise LmlabError(f"mask_prob {self.mask_prob} must be in (0, 1)",
                             "use e.g. 0.15 (BERT) or 0.4 (Wettig et al. 2023)")
        if self.ceiling is not None and not resolve_short_name(self.ceiling).exists():
            raise LmlabError(f"the ceiling model {self.ceiling!r} does not exist",
                             "give a checkpoint folder or a short name from `lmlab models "
                             "list`, or --ceiling none")
        for option, value in (("--max-documents", self.max_documents),
                              ("--max-train-examples", self.max_train_examples),
                              ("--max-eval-examples", self.max_eval_examples),
                              ("--threads", self.threads)):
            check_at_least(value, 1, option)

    def objective_args(self) -> dict[str, Any]:
        """``mask_prob`` for the objectives that mask tokens (none for, e.g., ``clm``)."""
        import inspect

        from lmlab.objectives.registry import check_objective_spec, get_factory

        masks = any("mask_prob" in inspect.signature(get_factory(name)).parameters
                    for name in check_objective_spec(self.objective))
        return {"mask_prob": self.mask_prob} if masks else {}

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
    demo folder, or ``overwrite`` given, before anything is computed or written. The stages
    run in order, each cached by :class:`StageRunner`: corpus, tokenizer, shards, pretraining,
    fine-tuning (with the TF-IDF baseline), analysis; the report is always rewritten.
    """
    config.validate()
    check_demo_folder(config.out, overwrite)
    import torch


    if config.threads:
        torch.set_num_threads(config.threads)
    precision_reason = "chosen by the caller"
    if config.precision == "auto":
        from dataclasses import replace

        from lmlab.utils.precision import auto_precision

        precision, precision_reason = auto_precision("cuda" if torch.cuda.is_available() else "cpu")
        config = replace(config, precision=precision)
        _say(f"precision {precision}: {precision_reason}")
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    log = StageLog()
    stages = StageRunner(out, fresh=config.fresh, log=log)
    started = time.perf_counter()
    corpus_folder, corpus = _corpus_stage(config, stages)
    tok_folder, tok_info = _tokenizer_stage(config, stages, corpus_folder)
    shards_folder, shards = _shards_stage(stages, corpus_folder, tok_folder, tok_info)
    from lmlab.demo.analysis import unigram_baseline, unigram_counts

    unigram = unigram_baseline(unigram_counts(shards_folder / "shards"))
    data_seconds = time.perf_counter() - started
    pretrain_folder, pretrain = _pretrain_stage(config, stages, shards_folder, tok_folder)
    pretrained_model = Path(pretrain["run"]) / "model"
    results = _finetune_stages(config, stages, pretrain_folder, pretrained_model)
    analysis = _analysis_stage(config, stages, pretrain_folder, pretrained_model,
                               corpus_folder / "corpus", shards_folder / "shards")

    # the report (always rewritten: cheap, and it records this invocation's timings)
    _say("6/6 report")
    from lmlab.demo.report import write_report

    summary = {
        "settings": config.result_settings(), "corpus": corpus, "tokenizer": tok_info,
        "shards": shards, "unigram": unigram, "precision_reason": precision_reason, "excluded_eval_texts": corpus["excluded_texts"],
        "pretrain_run": pretrain["run"], "results": results, "analysis": analysis,
        "stages": log.entries, "data_seconds": round(data_seconds, 1),
        "total_seconds": round(time.perf_counter() - started, 1),
    }
    atomic_write_json(out / "summary.json", summary)
    report = write_report(out, summary)
    _say(f"done in {summary['total_seconds'] / 60:.1f} min; report: {report}")
    return report


def _corpus_stage(config: DemoConfig, stages: StageRunner) -> tuple[Path, dict[str, Any]]:
    """1. The corpus, without the dev/test texts of the built-in tasks (build_corpus's
    default): its folder and word, document and exclusion counts."""
    def work(folder: Path) -> dict[str, Any]:
        from lmlab.data.build import build_corpus

        manifest = build_corpus(config.sources, folder / "corpus",
                                max_documents=config.max_documents)
        return {"words": manifest["total_words"], "documents": manifest["total_documents"],
                "excluded_texts": sum(e["texts"] for e in manifest["exclude"]),
                "excluded_words": manifest["excluded_words"],
                "excluded_documents": manifest["excluded_documents"]}

    _say("1/6 corpus, without the built-in tasks' dev/test texts")
    return stages.run("corpus", {"sources": config.sources, "max_documents": config.max_documents,
                                 "exclude": "builtin-tasks-dev-test-segments"}, work)


def _tokenizer_stage(config: DemoConfig, stages: StageRunner,
                     corpus_folder: Path) -> tuple[Path, dict[str, Any]]:
    """2a. A WordPiece tokenizer trained on the corpus (in ``FOLDER/tokenizer``)."""
    def work(folder: Path) -> dict[str, Any]:
        from lmlab.tokenization.tokenizer import Tokenizer

        tokenizer = Tokenizer.train(corpus_folder / "corpus", kind="wordpiece",
                                    vocab_size=config.vocab_size, show_progress=False)
        tokenizer.save_pretrained(folder / "tokenizer")
        return {"vocab_size": len(tokenizer), "fingerprint": tokenizer.fingerprint()}

    _say("2/6 WordPiece tokenizer and token shards")
    return stages.run("tokenizer", {"corpus": corpus_folder.name,
                                    "vocab_size": config.vocab_size}, work)


def _shards_stage(stages: StageRunner, corpus_folder: Path, tok_folder: Path,
                  tok_info: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """2b. The corpus as token shards (in ``FOLDER/shards``): tokens and documents per split."""
    def work(folder: Path) -> dict[str, Any]:
        from lmlab.data.shards import build_shards
        from lmlab.tokenization.tokenizer import Tokenizer

        manifest = build_shards(Tokenizer.from_pretrained(tok_folder / "tokenizer"),
                                corpus_folder / "corpus", folder / "shards")
        return {split: {"tokens": info["num_tokens"], "documents": info["num_documents"]}
                for split, info in manifest.get("splits", {}).items()}

    return stages.run("shards", {"tokenizer": tok_info["fingerprint"],
                                 "corpus": corpus_folder.name}, work)


def _pretrain_stage(config: DemoConfig, stages: StageRunner, shards_folder: Path,
                    tok_folder: Path) -> tuple[Path, dict[str, Any]]:
    """3. Pretraining through ``lmlab.pretrain`` for :data:`PRETRAIN_SHARE` of the budget;
    resumable (a killed demo continues from the run's last checkpoint)."""
    def work(folder: Path) -> dict[str, Any]:
        import lmlab
        from lmlab.training import TrainingConfig
        from lmlab.training.pretrain import DataSettings, ModelSettings, ObjectiveSettings

        run = folder / "run"
        training = TrainingConfig(
            lr=config.pretrain_lr, warmup_fraction=config.pretrain_warmup,
            schedule=config.pretrain_schedule, seq_len=config.seq_len,
            batch_size=config.batch_size, budget_seconds=float(round(config.pretrain_seconds)),
            seed=0, eval_every=250, save_every=250, threads=config.threads,
            precision=config.precision)
        result = lmlab.pretrain(lmlab.PretrainConfig(
            out=run, training=training,
            model=ModelSettings(config.family, config.size, model_args=dict(config.model_args)),
            objective=ObjectiveSettings(config.objective, config.objective_args()),
            data=DataSettings(shards_folder / "shards", str(tok_folder / "tokenizer"))))
        _say(f"pretraining: {result.stop_reason} after {result.step:,} steps, "
             f"{result.tokens:,} tokens")
        return {"run": str(run)}

    _say(f"3/6 pretraining a {model_name(config.family, config.size)} with {config.objective} "
         f"({config.pretrain_seconds / 60:.1f} min)")
    return stages.run("pretrain", pretrain_inputs(config, shards_folder.name), work,
                      resumable=True)


def pretrain_inputs(config: DemoConfig, shards: str) -> dict[str, Any]:
    """What names the pretraining stage's folder: every setting that changes its result."""
    return {"shards": shards, "family": config.family, "size": config.size,
            "objective": config.objective, "seq_len": config.seq_len,
            "batch_size": config.batch_size, "lr": config.pretrain_lr,
            "warmup": config.pretrain_warmup, "schedule": config.pretrain_schedule,
            "mask_prob": config.mask_prob, "model_args": config.model_args,
            "precision": config.precision, "seconds": round(config.pretrain_seconds)}


def _finetune_stages(config: DemoConfig, stages: StageRunner, pretrain_folder: Path,
                     pretrained_model: Path) -> dict[str, dict[str, list[dict]]]:
    """4. Fine-tuning on each task and seed: the pretrained model, the same architecture
    randomly initialised, and the TF-IDF baseline; then the ceiling model (``config.ceiling``,
    e.g. MiniLM) with the same recipe on the first seed. Returns task -> kind -> per-seed
    results (kinds "pretrained", "random", "tfidf" and, with a ceiling, "ceiling")."""
    from lmlab.models.catalog import resolve_short_name
    from lmlab.tasks.builtin import load_builtin_task

    results: dict[str, dict[str, list[dict]]] = {}
    ceiling = f", and {config.ceiling} as the ceiling" if config.ceiling else ""
    _say(f"4/6 fine-tuning on {', '.join(config.tasks)} x seeds {list(config.seeds)} "
         f"({config.finetune_seconds_per_run:.0f} s per run), the TF-IDF baseline{ceiling}")
    for task_name in config.tasks:
        task = _subset_eval(load_builtin_task(task_name, "cpu"), config.max_eval_examples)
        results[task_name] = {"pretrained": [], "random": [], "tfidf": []}
        for seed in config.seeds:
            for kind in ("pretrained", "random"):
                results[task_name][kind].append(_finetune_run(
                    config, stages, task, kind, seed, pretrained_model, pretrain_folder.name,
                    config.finetune_seconds_per_run))
            results[task_name]["tfidf"].append(_baseline_run(config, stages, task, seed))
        if config.ceiling:
            results[task_name]["ceiling"] = [_finetune_run(
                config, stages, task, "ceiling", config.seeds[0],
                resolve_short_name(config.ceiling), config.ceiling,
                config.ceiling_seconds_per_run)]
    return results


def _finetune_run(config: DemoConfig, stages: StageRunner, task: Any, kind: str, seed: int,
                  model: Path, model_name: str, seconds: float) -> dict[str, Any]:
    """One fine-tuning run of ``model`` for ``seconds``: ``kind`` "pretrained", "ceiling" or
    "random" (the same architecture, randomly initialised); ``model_name`` names it in the
    stage's inputs (the pretraining stage's folder, or the ceiling's name)."""
    def work(folder: Path) -> dict[str, Any]:
        from lmlab.finetune.runner import finetune

        result = finetune(task, model, folder / "run", recipe="bert", seed=seed,
                          epochs=config.finetune_epochs, lr=config.finetune_lr,
                          batch_size=config.finetune_batch_size,
                          max_train_examples=config.max_train_examples,
                          budget_seconds=seconds, precision=config.precision,
                          pooling=config.finetune_pooling,
                          random_init=kind == "random", save_model=False, show_progress=True)
        return {"dev": result.get("dev"), "test": result.get("test"),
                "best_epoch": result.get("best_epoch"),
                "train_seconds": result.get("train_seconds")}

    return stages.run(f"finetune-{task.name}-{kind}-seed{seed}", {
        "model": model_name, "kind": kind, "seed": seed, "task": task.name,
        "lr": config.finetune_lr, "epochs": config.finetune_epochs,
        "batch": config.finetune_batch_size, "max_train": config.max_train_examples,
        "max_eval": config.max_eval_examples, "precision": config.precision,
        "pooling": config.finetune_pooling,
        "seconds": round(seconds)}, work)[1]


def _baseline_run(config: DemoConfig, stages: StageRunner, task: Any,
                  seed: int) -> dict[str, Any]:
    """The TF-IDF + logistic regression baseline on ``task`` with ``seed``."""
    def work(folder: Path) -> dict[str, Any]:
        from lmlab.finetune.runner import _subset
        from lmlab.tasks.baseline import run_tfidf_baseline

        result = run_tfidf_baseline(_subset(task, config.max_train_examples), seed=seed)
        return {"dev": result.get("dev"), "test": result.get("test"),
                "chosen": result.get("chosen")}

    return stages.run(f"tfidf-{task.name}-seed{seed}", {
        "task": task.name, "seed": seed, "max_train": config.max_train_examples,
        "max_eval": config.max_eval_examples}, work)[1]


def _analysis_stage(config: DemoConfig, stages: StageRunner, pretrain_folder: Path,
                    pretrained_model: Path, corpus_dir: Path, shards: Path) -> dict[str, Any]:
    """5. What the pretrained model learned: contextual neighbours, fill-mask, and its
    validation MLM score at BERT's 15% masking (comparable whatever rate it trained with)."""
    def work(folder: Path) -> dict[str, Any]:
        from lmlab.demo.analysis import contextual_examples, fill_mask_examples, masked_lm_score

        score = (masked_lm_score(pretrained_model, shards, seq_len=config.seq_len)
                 if config.objective_args() else None)
        return {"neighbours": contextual_examples(pretrained_model, corpus_dir, CONTEXT_EXAMPLES,
                                                  config.neighbour_occurrences),
                "fill_mask": fill_mask_examples(pretrained_model, FILL_MASK_EXAMPLES),
                "mlm_at_15": score}

    _say("5/6 contextual neighbours and fill-mask")
    return stages.run("analysis", {"model": pretrain_folder.name, "examples": CONTEXT_EXAMPLES,
                                   "fill": FILL_MASK_EXAMPLES,
                                   "occurrences": config.neighbour_occurrences}, work)[1]


def load_summary(out: str | Path) -> dict[str, Any]:
    return json.loads((Path(out) / "summary.json").read_text())
