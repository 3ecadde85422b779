"""The demo job, stage by stage, sharing one wall-clock budget that adapts to the host.

A host's speed decides how long pretraining runs, never how long a model is fine-tuned (every
run trains the same whole epochs on every host), so the comparison a user reads does not depend
on their CPU: the stages that need no pretrained model run first, and pretraining gets what
their recorded times leave of the budget (:func:`plan_pretraining`; docs/demo.md, "How the
budget is shared").
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from lmlab.demo.report import epochs_text, model_name, print_summary, write_report
from lmlab.demo.stages import StageLog, StageRunner
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import atomic_write_json

# pretraining's share of the budget: at least (a slow host still leaves the unigram plateau),
# at most (a fast host keeps the rest of its budget)
PRETRAIN_SHARE_RANGE = (0.25, 0.5)
REPORT_RESERVE = 0.05  # of the budget, for the analysis, the report and the time between stages
# the pretraining recipe chosen by the ablation in docs/demo.md (bench/ablation_demo_pretrain.py)
PRETRAIN_MODEL_ARGS = {"num_hidden_layers": 2, "hidden_dropout_prob": 0.0,
                       "attention_probs_dropout_prob": 0.0}

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
    # 3e-4: a 2-layer model pretrained for minutes is no fragile BERT-base; at the demo's few
    # updates it ended 5 points higher than 1e-4 on wordnet-supersense (docs/demo.md)
    finetune_lr: float = 3e-4
    # training tokens of every fine-tuning run, on every host (the comparison must not depend on
    # the CPU): whole epochs of each task's training split, at least one
    finetune_tokens: int = 200_000
    finetune_batch_size: int = 32
    # mean over the tokens: neither MLM-only pretraining nor MiniLM (sentence-transformers,
    # mean-pooled) trains the [CLS] pooler, so a head on it starts from noise
    finetune_pooling: str = "mean"
    # a pretrained checkpoint as the ceiling row: its frozen features (mean-pooled scalar mix of
    # its layers) and a trained head, the `feature` recipe: one forward pass over the task, so
    # it is a ceiling on a slow CPU too (fine-tuned in the time a slow CPU has, it was not)
    ceiling: str | None = "minilm"
    max_train_examples: int | None = None
    max_eval_examples: int | None = None
    neighbour_occurrences: int = 300
    fresh: bool = False
    threads: int | None = field(default=None, metadata={"speed": True})

    def validate(self) -> None:
        """Check every setting before any stage runs: a typo in ``tasks`` must not cost the
        data stages and the pretraining first. Names are checked against the registries
        (tasks, sources, model presets, objectives), numbers against their ranges."""
        from lmlab.data.build import resolve_sources
        from lmlab.models.presets import preset
        from lmlab.objectives.registry import check_objective_spec
        from lmlab.tasks.builtin import BUILTIN_TASKS
        from lmlab.training import TrainingConfig
        from lmlab.utils.catalog import resolve_short_name
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
                              ("--threads", self.threads),
                              ("--finetune-tokens", self.finetune_tokens)):
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
    """``task`` with ``count`` examples of its dev and test splits (a stratified sample)."""
    from lmlab.tasks.sampling import sample_examples

    if not count:
        return task
    return replace(task, splits={**task.splits, **{
        split: sample_examples(task.splits[split], count) for split in ("dev", "test")
        if split in task.splits}})


def run_demo(config: DemoConfig, overwrite: bool = False) -> Path:
    """Run (or resume) the whole demo; returns the path of the markdown report.

    Settings and ``config.out`` are checked before anything is computed. The stages run in
    order, each cached by :class:`StageRunner`: corpus, tokenizer, shards; the baselines
    (TF-IDF, random init, the ceiling); pretraining; the pretrained model's fine-tuning;
    analysis. The report is always rewritten.
    """
    from lmlab.utils.checks import check_output_folder

    config.validate()
    # a demo's folder (stages/) is resumed; another is refused unless overwrite, which writes
    # the stages and report beside what is there
    if not (Path(config.out) / "stages").is_dir():
        check_output_folder(config.out, overwrite, "demo")
    import torch

    if config.threads:
        torch.set_num_threads(config.threads)
    precision_reason = "chosen by the caller"
    if config.precision == "auto":
        from lmlab.cost.precision import auto_precision

        precision, precision_reason = auto_precision("cuda" if torch.cuda.is_available() else "cpu")
        config = replace(config, precision=precision)
        _say(f"precision {precision}: {precision_reason}")
    out = Path(config.out)
    log = StageLog()
    stages = StageRunner(out, fresh=config.fresh, log=log)
    started = time.perf_counter()
    corpus_folder, corpus = _corpus_stage(config, stages)
    tok_folder, tok_info = _tokenizer_stage(config, stages, corpus_folder)
    shards_folder, shards = _shards_stage(stages, corpus_folder, tok_folder, tok_info)
    from lmlab.demo.analysis import unigram_baseline, unigram_counts

    unigram = unigram_baseline(unigram_counts(shards_folder / "shards"))
    data_seconds = time.perf_counter() - started
    architecture = _architecture_stage(config, stages, tok_folder, tok_info)
    from lmlab.tasks.builtin import load_builtin_task

    tasks = [_subset_eval(load_builtin_task(name, "cpu"), config.max_eval_examples)
             for name in config.tasks]
    epochs = {task.name: finetune_epochs(config, task, architecture) for task in tasks}
    results = _baseline_stages(config, stages, tasks, epochs, architecture)
    plan = plan_pretraining(config.budget, spent=log.recorded_seconds(),
                            expected=log.recorded_seconds("finetune-", "-random-"))
    plan["finetune_epochs"] = epochs
    pretrain_folder, pretrain = _pretrain_stage(config, stages, shards_folder, tok_folder,
                                                plan["pretrain_seconds"])
    pretrained_model = Path(pretrain["run"]) / "model"
    _pretrained_stages(config, stages, tasks, epochs, results, pretrain_folder, pretrained_model)
    analysis = _analysis_stage(config, stages, pretrain_folder, pretrained_model,
                               corpus_folder / "corpus", shards_folder / "shards")

    # the report (always rewritten: cheap, and it records this invocation's timings)
    _say("7/7 report")
    plan["recorded_seconds"] = round(log.recorded_seconds(), 1)
    summary = {
        "settings": config.result_settings(), "corpus": corpus, "tokenizer": tok_info,
        "shards": shards, "unigram": unigram, "precision_reason": precision_reason,
        "excluded_eval_texts": corpus["excluded_texts"], "plan": plan,
        "pretrain_run": pretrain["run"], "results": results, "analysis": analysis,
        "stages": log.entries, "data_seconds": round(data_seconds, 1),
        "total_seconds": round(time.perf_counter() - started, 1),
    }
    atomic_write_json(out / "summary.json", summary)
    report = write_report(out, summary)
    _say(f"done in {summary['total_seconds'] / 60:.1f} min; report: {report}")
    print_summary(summary, report)
    return report


def plan_pretraining(budget: float, spent: float, expected: float) -> dict[str, Any]:
    """How long pretraining runs: the budget less the finished stages' recorded seconds
    (``spent``), the pretrained model's fine-tuning still to come (``expected``) and
    :data:`REPORT_RESERVE`, within :data:`PRETRAIN_SHARE_RANGE` of the budget. Whole seconds:
    they name the pretraining stage, which a rerun finds again."""
    low, high = PRETRAIN_SHARE_RANGE
    left = budget * (1 - REPORT_RESERVE) - spent - expected
    seconds = float(round(min(max(left, low * budget), high * budget)))
    return {"budget": budget, "spent_before_pretraining": round(spent, 1),
            "expected_finetuning": round(expected, 1), "pretrain_seconds": seconds,
            "limited_by": ("the lower bound" if left < low * budget else
                           "the upper bound" if left > high * budget else "the budget")}


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

    _say("1/7 corpus, without the built-in tasks' dev/test texts")
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

    _say("2/7 WordPiece tokenizer and token shards")
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
                    tok_folder: Path, seconds: float) -> tuple[Path, dict[str, Any]]:
    """4. Pretraining through ``lmlab.pretrain`` for ``seconds`` (:func:`plan_pretraining`);
    resumable (a killed demo continues from the run's last checkpoint)."""
    def work(folder: Path) -> dict[str, Any]:
        from lmlab.training.pretrain import PretrainConfig, pretrain

        run = folder / "run"
        result = pretrain(PretrainConfig.from_sections(
            None, out=run, lr=config.pretrain_lr, warmup_fraction=config.pretrain_warmup,
            schedule=config.pretrain_schedule, seq_len=config.seq_len,
            batch_size=config.batch_size, budget_seconds=seconds, seed=0, eval_every=250,
            save_every=250, threads=config.threads, precision=config.precision,
            family=config.family, size=config.size, model_args=dict(config.model_args),
            objective=config.objective, objective_args=config.objective_args(),
            shards=shards_folder / "shards", tokenizer=str(tok_folder / "tokenizer")))
        _say(f"pretraining: {result.stop_reason} after {result.step:,} steps, "
             f"{result.tokens:,} tokens")
        return {"run": str(run)}

    _say(f"4/7 pretraining a {model_name(config.family, config.size)} with {config.objective} "
         f"for {seconds / 60:.1f} min (what the budget leaves after the measured stages)")
    return stages.run("pretrain", pretrain_inputs(config, shards_folder.name, seconds), work,
                      resumable=True)


def pretrain_inputs(config: DemoConfig, shards: str, seconds: float) -> dict[str, Any]:
    """What names the pretraining stage's folder: every setting that changes its result."""
    return {"shards": shards, "family": config.family, "size": config.size,
            "objective": config.objective, "seq_len": config.seq_len,
            "batch_size": config.batch_size, "lr": config.pretrain_lr,
            "warmup": config.pretrain_warmup, "schedule": config.pretrain_schedule,
            "mask_prob": config.mask_prob, "model_args": config.model_args,
            "precision": config.precision, "seconds": round(seconds)}


def _architecture_stage(config: DemoConfig, stages: StageRunner, tok_folder: Path,
                        tok_info: dict[str, Any]) -> Path:
    """The pretraining model's architecture with the demo's tokenizer (``FOLDER/model``): the
    random-init runs start from it before pretraining has run."""
    def work(folder: Path) -> dict[str, Any]:
        from lmlab.interop.native import save_pretrained
        from lmlab.models.model import LanguageModel
        from lmlab.models.presets import preset
        from lmlab.tokenization.tokenizer import Tokenizer

        tokenizer = Tokenizer.from_pretrained(tok_folder / "tokenizer")
        model_config = preset(config.family, config.size, vocab_size=len(tokenizer),
                              **config.model_args)
        save_pretrained(LanguageModel(model_config), folder / "model")
        tokenizer.save_pretrained(folder / "model")
        return {"model": str(folder / "model")}

    folder, _ = stages.run("architecture", {"family": config.family, "size": config.size,
                                            "model_args": config.model_args,
                                            "tokenizer": tok_info["fingerprint"]}, work)
    return folder / "model"


def finetune_epochs(config: DemoConfig, task: Any, tokenizer_folder: Path) -> int:
    """The whole epochs of ``task``'s training split nearest to ``config.finetune_tokens``
    training tokens under the demo's tokenizer (at least one): every fine-tuning run of the
    task trains this long, on every host."""
    from lmlab.finetune.data import encode_examples
    from lmlab.finetune.runner import _subset, load_tokenizer

    examples = _subset(task, config.max_train_examples).split("train")
    features = encode_examples(task, examples, load_tokenizer(tokenizer_folder))
    return max(1, round(config.finetune_tokens / max(1, sum(map(len, features)))))


def _baseline_stages(config: DemoConfig, stages: StageRunner, tasks: list[Any],
                     epochs: dict[str, int],
                     architecture: Path) -> dict[str, dict[str, list[dict]]]:
    """3. What needs no pretrained model, on each task: the TF-IDF baseline and the randomly
    initialised architecture for every seed, and the ceiling model's frozen features (one
    run). Returns task -> kind -> per-seed results (kinds "random", "tfidf", "ceiling")."""
    from lmlab.utils.catalog import resolve_short_name

    ceiling = f" and {config.ceiling}'s frozen features (the ceiling)" if config.ceiling else ""
    _say(f"3/7 on {', '.join(config.tasks)} x seeds {list(config.seeds)}: TF-IDF, the "
         f"architecture from random weights ({epochs_text(epochs)}){ceiling}; their measured "
         "times decide how long pretraining runs")
    results: dict[str, dict[str, list[dict]]] = {}
    for task in tasks:
        results[task.name] = {"pretrained": [], "random": [], "tfidf": []}
        for seed in config.seeds:
            results[task.name]["tfidf"].append(_baseline_run(config, stages, task, seed))
            results[task.name]["random"].append(_finetune_run(
                config, stages, task, "random", seed, architecture,
                architecture.parent.name, epochs[task.name]))
        if config.ceiling:
            results[task.name]["ceiling"] = [_finetune_run(
                config, stages, task, "ceiling", config.seeds[0],
                resolve_short_name(config.ceiling), config.ceiling, None)]
    return results


def _pretrained_stages(config: DemoConfig, stages: StageRunner, tasks: list[Any],
                       epochs: dict[str, int], results: dict[str, dict[str, list[dict]]],
                       pretrain_folder: Path, pretrained_model: Path) -> None:
    """5. The pretrained model fine-tuned on each task and seed (into ``results``)."""
    _say(f"5/7 fine-tuning the pretrained model on {', '.join(config.tasks)} x seeds "
         f"{list(config.seeds)} ({epochs_text(epochs)})")
    for task in tasks:
        results[task.name]["pretrained"] = [
            _finetune_run(config, stages, task, "pretrained", seed, pretrained_model,
                          pretrain_folder.name, epochs[task.name]) for seed in config.seeds]


def _finetune_run(config: DemoConfig, stages: StageRunner, task: Any, kind: str, seed: int,
                  model: Path, model_name: str, epochs: int | None) -> dict[str, Any]:
    """One fine-tuning run of ``model`` for ``epochs`` epochs: ``kind`` "pretrained", "random"
    (the same architecture, randomly initialised) or "ceiling" (the frozen model with a
    trained head: the ``feature`` recipe's own epochs, ``epochs`` None); ``model_name`` names
    it in the stage's inputs (the stage folder it came from, or the ceiling's name)."""
    def work(folder: Path) -> dict[str, Any]:
        from lmlab.finetune.runner import finetune

        if kind == "ceiling":
            settings: dict[str, Any] = {"recipe": "feature"}
        else:
            settings = {"recipe": "bert", "epochs": epochs,
                        "lr": config.finetune_lr, "batch_size": config.finetune_batch_size,
                        "pooling": config.finetune_pooling}
        result = finetune(task, model, folder / "run", seed=seed,
                          max_train_examples=config.max_train_examples,
                          precision=config.precision, random_init=kind == "random",
                          save_model=False, show_progress=True, **settings)
        return {key: result.get(key) for key in ("dev", "test", "best_epoch", "train_seconds")}

    inputs = {"model": model_name, "kind": kind, "seed": seed, "task": task.name,
              "max_train": config.max_train_examples, "max_eval": config.max_eval_examples,
              "precision": config.precision}
    if kind != "ceiling":
        inputs.update(lr=config.finetune_lr, epochs=epochs,
                      batch=config.finetune_batch_size, pooling=config.finetune_pooling)
    return stages.run(f"finetune-{task.name}-{kind}-seed{seed}", inputs, work)[1]


def _baseline_run(config: DemoConfig, stages: StageRunner, task: Any,
                  seed: int) -> dict[str, Any]:
    """The TF-IDF + logistic regression baseline on ``task`` with ``seed``."""
    def work(folder: Path) -> dict[str, Any]:
        from lmlab.finetune.runner import _subset
        from lmlab.tasks.baseline import run_tfidf_baseline

        result = run_tfidf_baseline(_subset(task, config.max_train_examples), seed=seed)
        return {key: result.get(key) for key in ("dev", "test", "chosen")}

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

    _say("6/7 contextual neighbours and fill-mask")
    return stages.run("analysis", {"model": pretrain_folder.name, "examples": CONTEXT_EXAMPLES,
                                   "fill": FILL_MASK_EXAMPLES,
                                   "occurrences": config.neighbour_occurrences}, work)[1]
