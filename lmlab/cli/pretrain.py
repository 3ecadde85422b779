"""``lmlab pretrain``: train a model family/size with an objective on token shards.

The same command scales out: ``torchrun --nproc-per-node N -m lmlab.cli pretrain ...`` trains
with DDP (``--strategy fsdp`` for FSDP); ``--batch-size`` is then the global batch.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from lmlab.cli._common import pretrain_choices
from lmlab.utils.errors import LmlabError

# keys of the hparams: section that describe the model and data, not the TrainingConfig
RUN_HPARAMS = ("family", "size", "objective", "objective_args", "shards", "init", "model_args",
               "eval_batches")
RUN_SPEED: tuple[str, ...] = ()

# CLI flag -> (section, key, converter)
_FLAGS: dict[str, tuple[str, str]] = {
    "family": ("hparams", "family"), "size": ("hparams", "size"),
    "objective": ("hparams", "objective"), "shards": ("hparams", "shards"),
    "init": ("hparams", "init"), "seq_len": ("hparams", "seq_len"),
    "batch_size": ("hparams", "batch_size"), "lr": ("hparams", "lr"),
    "warmup": ("hparams", "warmup"), "schedule": ("hparams", "schedule"),
    "weight_decay": ("hparams", "weight_decay"), "clip_norm": ("hparams", "clip_norm"),
    "steps": ("hparams", "max_steps"), "tokens": ("hparams", "max_tokens"),
    "budget": ("hparams", "budget_seconds"), "seed": ("hparams", "seed"),
    "grad_accum": ("hparams", "grad_accum"), "eval_batches": ("hparams", "eval_batches"),
    "precision": ("speed", "precision"), "compile": ("speed", "compile"),
    "threads": ("speed", "threads"), "workers": ("speed", "workers"),
    "eval_every": ("speed", "eval_every"), "save_every": ("speed", "save_every"),
    "keep_last": ("speed", "keep_last"), "log_every": ("speed", "log_every"),
    "strategy": ("speed", "strategy"), "device": ("speed", "device"),
    "price_per_hour": ("cost", "price_per_hour"), "grid_intensity": ("cost", "grid_g_per_kwh"),
}


def register(commands) -> None:
    p = commands.command(
        "pretrain", help="pretrain a Transformer with an objective on token shards",
        example="lmlab pretrain --family bert --size mini --objective mlm,sop --shards shards/ "
                "--budget 10m --out runs/mini",
        handler=_pretrain,
        description="Pretrain (or continue pretraining) a model. The run directory gets "
                    "config.json, metrics.jsonl, checkpoints/, model/, report.md. Rerunning "
                    "the same command on the same --out resumes from the last checkpoint.",
    )
    p.add_argument("--config", help="YAML/JSON file with hparams: and speed: sections "
                                     "(flags override it)")
    choices = pretrain_choices()  # from the registries: what --help lists is what works
    p.add_argument("--family", help=f"model family: {choices['families']}")
    p.add_argument("--size", help=f"preset size of the family: {choices['sizes']}")
    p.add_argument("--objective", help="objective(s), comma-separated, e.g. mlm or mlm,sop: "
                                       f"{choices['objectives']}")
    p.add_argument("--shards", help="token-shard folder (from `lmlab data tokenize`)")
    p.add_argument("--out", required=True, help="run directory (resumed when it has checkpoints)")
    p.add_argument("--init", help="start from a checkpoint: a run directory, a checkpoint "
                                  "folder, a Hugging Face model folder or a short name "
                                  "from `lmlab models list` (minilm)")
    p.add_argument("--seq-len", type=int)
    p.add_argument("--batch-size", type=int, help="global batch size (sequences per step)")
    p.add_argument("--lr", type=float)
    p.add_argument("--warmup", help="warmup: steps (e.g. 500) or a fraction (e.g. 0.06)")
    p.add_argument("--schedule", help="linear | cosine | constant | inverse_sqrt | triangular")
    p.add_argument("--weight-decay", type=float)
    p.add_argument("--clip-norm", type=float)
    p.add_argument("--steps", help="stop after this many optimizer steps")
    p.add_argument("--tokens", help="stop after this many tokens (e.g. 5M)")
    p.add_argument("--budget", help="stop after this wall-clock time (e.g. 10m, 1.5h)")
    p.add_argument("--seed", type=int)
    p.add_argument("--grad-accum", type=int)
    p.add_argument("--eval-every", type=int, help="evaluate every N steps (and at the end)")
    p.add_argument("--eval-batches", type=int, help="validation batches (default 8)")
    p.add_argument("--save-every", type=int, help="checkpoint every N steps (and at the end)")
    p.add_argument("--keep-last", type=int)
    p.add_argument("--log-every", type=int)
    p.add_argument("--precision", choices=["fp32", "bf16"])
    p.add_argument("--compile", action="store_true", default=None)
    p.add_argument("--threads", type=int)
    p.add_argument("--workers", type=int)
    p.add_argument("--strategy", choices=["auto", "ddp", "fsdp"])
    p.add_argument("--device", help="auto | cpu | cuda")
    p.add_argument("--tokenizer", help="tokenizer folder (default: the one the shards record)")
    p.add_argument("--no-cost", action="store_true", help="do not track FLOPs/energy/cost")
    p.add_argument("--overwrite", action="store_true",
                   help="write into an --out folder that holds other files, or start a run "
                        "that is there over (its checkpoints, metrics and model are removed) "
                        "instead of resuming it")
    p.add_argument("--price-per-hour", type=float,
                   help="cost report: price per device-hour, for the money figure (no default)")
    p.add_argument("--grid-intensity", type=float,
                   help="cost report: grid carbon intensity in g CO2e/kWh (default 480, the "
                        "2023 world average)")


def resolve_settings(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Config file sections overlaid with the flags that were given."""
    from lmlab.training.config import load_config_file

    sections: dict[str, dict[str, Any]] = {"hparams": {}, "speed": {}, "cost": {}}
    if getattr(args, "config", None):
        loaded = load_config_file(args.config)
        for key in sections:
            sections[key].update(loaded.get(key) or {})
    for flag, (section, key) in _FLAGS.items():
        value = getattr(args, flag, None)
        if value is not None:
            sections[section][key] = value
    return sections


def training_config(sections: dict[str, dict[str, Any]]):
    """A :class:`TrainingConfig` from resolved sections (durations, counts, warmup parsed)."""
    from lmlab.training.config import TrainingConfig
    from lmlab.utils.durations import parse_count, parse_duration

    hparams = dict(sections["hparams"])
    speed = dict(sections["speed"])
    for key in ("max_steps", "max_tokens"):
        if hparams.get(key) is not None:
            hparams[key] = parse_count(hparams[key])
    if hparams.get("budget_seconds") is not None:
        hparams["budget_seconds"] = parse_duration(hparams["budget_seconds"])
    warmup = hparams.pop("warmup", None)
    if warmup is not None:
        try:
            value = float(warmup)
        except ValueError:
            raise LmlabError(f"cannot read the warmup {warmup!r}",
                             "give optimizer steps (e.g. --warmup 500) or a fraction of the "
                             "run (e.g. --warmup 0.06)") from None
        if value < 0:
            raise LmlabError(f"--warmup must be >= 0, got {warmup}", "use e.g. 0.06 or 500")
        if 0 < value < 1:
            hparams["warmup_fraction"] = value
        else:
            hparams["warmup_steps"] = int(value)
    known = set(TrainingConfig.field_names())
    unknown = sorted((set(hparams) - known - set(RUN_HPARAMS)) | (set(speed) - known))
    if unknown:
        raise LmlabError(f"unknown settings: {', '.join(unknown)}",
                         f"known: {', '.join(sorted(known | set(RUN_HPARAMS)))}")
    train_values = {"hparams": {k: v for k, v in hparams.items() if k in known}, "speed": speed}
    return TrainingConfig.from_sections(train_values)


def find_tokenizer(shards: Path, override: str | None):
    """The tokenizer the shards were written with (checked by fingerprint)."""
    from lmlab.tokenization.tokenizer import Tokenizer
    from lmlab.utils.io import read_json

    manifest_path = shards / "manifest.json"
    if not manifest_path.is_file():
        raise LmlabError(f"{shards} has no manifest.json", "build shards with `lmlab data "
                         "tokenize --tokenizer T --corpus DIR --out SHARDS`")
    info = read_json(manifest_path).get("tokenizer", {})
    from lmlab.models.catalog import resolve_short_name

    candidates = [str(resolve_short_name(override))] if override else [
        str(shards / "tokenizer"), info.get("name_or_path")]
    for candidate in candidates:
        if candidate and Path(candidate).exists():
            tokenizer = Tokenizer.from_pretrained(candidate)
            if info.get("fingerprint") and tokenizer.fingerprint() != info["fingerprint"]:
                raise LmlabError(f"tokenizer {candidate} is not the one {shards} was written with "
                                 "(fingerprints differ)", "pass --tokenizer with the right folder")
            return tokenizer, Path(candidate)
    raise LmlabError(f"cannot find the tokenizer of {shards} (manifest names "
                     f"{info.get('name_or_path')!r})", "pass --tokenizer PATH")


def build_model(hparams: dict[str, Any], tokenizer: Any):
    """A fresh preset model, or one initialised from ``hparams['init']``."""
    init = hparams.get("init")
    if init:
        model = load_init(Path(init), len(tokenizer))
        positions, seq_len = model.config.max_position_embeddings, int(hparams.get("seq_len", 128))
        if positions < seq_len:
            raise LmlabError(f"--seq-len {seq_len} exceeds the --init model's {positions} "
                             "positions", f"use --seq-len {positions} or less")
        return model
    from lmlab.models.model import LanguageModel
    from lmlab.models.presets import preset

    family, size = hparams.get("family"), hparams.get("size")
    if not family or not size:
        raise LmlabError("no model given", "pass --family and --size (or --init PATH)")
    overrides = dict(hparams.get("model_args") or {})
    overrides.setdefault("vocab_size", len(tokenizer))
    if tokenizer.pad_token_id is not None:
        overrides.setdefault("pad_token_id", tokenizer.pad_token_id)
    seq_len = int(hparams.get("seq_len", 128))
    config = preset(family, size, **overrides)
    if config.max_position_embeddings < seq_len:
        raise LmlabError(f"--seq-len {seq_len} exceeds the model's {config.max_position_embeddings}"
                         " positions", "use a shorter --seq-len")
    return LanguageModel(config, heads=())


def load_init(path: Path, vocab_size: int):
    """Weights to start from: an lmlab checkpoint folder (``step-N``), a run directory or a
    Hugging Face folder (through ``lmlab.from_pretrained``)."""
    import json

    from lmlab.models.config import TransformerConfig
    from lmlab.models.model import LanguageModel
    from lmlab.training import checkpoint as ckpt

    if (path / "checkpoints").is_dir() and not (path / "model").is_dir():
        latest = ckpt.latest_checkpoint(path / "checkpoints")
        if latest is None:
            raise LmlabError(f"{path} has no complete checkpoint", "point --init at a finished run")
        path = latest
    if (path / "state.json").is_file():  # a checkpoint folder: config from its run
        run_config = json.loads((path.parent.parent / "config.json").read_text())
        config = TransformerConfig.from_dict(run_config["model"])
        state = ckpt.load_state(path / "model.safetensors")
        heads = sorted({k.split(".")[1] for k in state if k.startswith("heads.")})
        model = LanguageModel(config, heads=heads,
                              with_pooler=any(k.startswith("pooler.") for k in state))
        ckpt.load_into(model, state, path)
    else:
        import lmlab

        target = path / "model" if (path / "model" / "config.json").is_file() else path
        model = lmlab.from_pretrained(target)
        model.train()
    if model.config.vocab_size != vocab_size:
        raise LmlabError(f"--init model has {model.config.vocab_size} tokens but the shards' "
                         f"tokenizer has {vocab_size}", "tokenize the corpus with the "
                         "checkpoint's own tokenizer (its folder) and pass those shards")
    print(f"lmlab: initialised from {path} ({model.num_parameters():,} parameters)", flush=True)
    return model


def check_pretrain_inputs(hparams: dict[str, Any], seq_len: int,
                          tokenizer: str | None) -> tuple[Path, str]:
    """Check every model and data argument before any work: the shards folder, the objective
    names, the family and size (or the --init checkpoint), --seq-len against the model's
    positions, the tokenizer folder. Returns (shards folder, objective spec)."""
    from lmlab.models.presets import preset
    from lmlab.objectives.registry import check_objective_spec
    from lmlab.utils.checks import check_at_least, check_folder

    shards = hparams.get("shards")
    if not shards:
        raise LmlabError("no training data given", "pass --shards DIR (from `lmlab data tokenize`)")
    shards = check_folder(shards, "--shards", "give the folder written by `lmlab data tokenize "
                          "--out SHARDS`", holds="manifest.json", what="token-shard folder")
    spec = hparams.get("objective") or "mlm"
    check_objective_spec(spec)
    for key in ("objective_args", "model_args"):
        if not isinstance(hparams.get(key) or {}, dict):
            raise LmlabError(f"{key} must be a mapping of names to values, got "
                             f"{hparams[key]!r}", f"write {key}: as a YAML mapping")
    check_at_least(hparams.get("eval_batches"), 1, "--eval-batches")
    from lmlab.models.catalog import resolve_short_name

    if tokenizer is not None and not resolve_short_name(tokenizer).exists():
        raise LmlabError(f"--tokenizer {tokenizer} does not exist",
                         "give the tokenizer folder the shards were written with")
    init = hparams.get("init")
    if init:
        if not resolve_short_name(init).exists():
            raise LmlabError(f"--init {init} does not exist", "give a run directory, a "
                             "checkpoint folder, a Hugging Face model folder or a short name "
                             "from `lmlab models list`")
        return shards, spec
    family, size = hparams.get("family"), hparams.get("size")
    if not family or not size:
        raise LmlabError("no model given", "pass --family and --size (or --init PATH)")
    config = preset(family, size, **(hparams.get("model_args") or {}))
    if config.max_position_embeddings < seq_len:
        raise LmlabError(f"--seq-len {seq_len} exceeds the {family}-{size} model's "
                         f"{config.max_position_embeddings} positions",
                         f"use --seq-len {config.max_position_embeddings} or less")
    return shards, spec


def _pretrain(args: argparse.Namespace) -> int:
    import shutil

    from lmlab.cost.report import cost_settings
    from lmlab.training.run_dir import RunRecord, prepare_run_folder, shards_fingerprint
    from lmlab.utils.io import read_json

    sections = resolve_settings(args)
    cfg = training_config(sections)
    costs = cost_settings(sections["cost"])
    hparams = sections["hparams"]
    shards, spec = check_pretrain_inputs(hparams, cfg.seq_len, args.tokenizer)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise LmlabError(f"--out {out} is a file", "give the path of a run folder")
    tokenizer, tokenizer_dir = find_tokenizer(shards, args.tokenizer)
    hparams["objective"] = spec
    hparams.setdefault("eval_batches", 8)
    data = {"shards": str(shards), "tokenizer": str(tokenizer_dir),
            "tokenizer_fingerprint": tokenizer.fingerprint(),
            "shards_fingerprint": shards_fingerprint(read_json(shards / "manifest.json"))}
    extras = {k: hparams.get(k) for k in RUN_HPARAMS}
    prepare_run_folder(out, args.overwrite, {"hparams": {**cfg.to_sections()["hparams"],
                                                         **extras}, "data": data})

    from lmlab.training.trainer import Trainer, seed_everything

    if cfg.threads:
        import torch

        torch.set_num_threads(cfg.threads)
    from lmlab.data.pretraining import PretrainingStream, validation_batches
    from lmlab.objectives.registry import build_objective
    from lmlab.objectives.special_tokens import SpecialTokens

    seed_everything(cfg.seed)
    model = build_model(hparams, tokenizer)
    objective = build_objective(spec, SpecialTokens.from_tokenizer(tokenizer),
                                **(hparams.get("objective_args") or {}))
    before = set(model.heads.keys())
    if hasattr(objective, "prepare"):
        objective.prepare(model)
    added = [name for name in model.heads.keys() if name not in before]
    if added and hparams.get("init"):
        print(f"lmlab: the --init checkpoint has no {', '.join(added)} head; added a freshly "
              f"initialised one for {spec}", flush=True)
    stream = PretrainingStream(shards, split="train", objective=objective,
                               batch_size=cfg.batch_size, seq_len=cfg.seq_len, seed=cfg.seed,
                               workers=cfg.workers)
    eval_batches: list = []
    try:
        eval_batches = validation_batches(shards, objective=objective, batch_size=cfg.batch_size,
                                          seq_len=cfg.seq_len, seed=1234,
                                          max_batches=int(hparams.get("eval_batches", 8)))
    except LmlabError as error:
        print(f"lmlab: no validation batches ({error.problem}); evaluation is skipped",
              flush=True)
    run_tokenizer = out / "tokenizer"
    if not run_tokenizer.exists():
        from lmlab.training.report import copy_tokenizer

        src = tokenizer_dir
        copy_tokenizer(src, run_tokenizer) if src.is_dir() else shutil.copy(src, run_tokenizer)
    record = RunRecord(hparams=extras, model=model.config.to_dict(),
                       objective={"spec": spec, "heads": list(model.heads.keys())}, data=data)
    trainer = Trainer(model, objective, stream, cfg, out, eval_batches=eval_batches,
                      record=record, tokenizer_dir=run_tokenizer,
                      track_cost=not args.no_cost, cost_settings=costs)
    result = trainer.train()
    if trainer.dist.is_main:
        loss = f"{result.last_loss:.4f}" if result.last_loss is not None else "n/a"
        print(f"lmlab: {result.stop_reason}: {result.step:,} steps, {result.tokens:,} tokens, "
              f"{result.elapsed:.1f} s, last loss {loss}")
        if result.last_eval:
            print("lmlab: eval " + ", ".join(f"{k}={v:.4g}" for k, v in result.last_eval.items()))
        if result.cost is not None:
            print("lmlab: cost of this session (" + str(out / "cost.md") + ")\n"
                  + (out / "cost.md").read_text(encoding="utf-8").rstrip())
        print(f"lmlab: report {out / 'report.md'}; model {out / 'model'}")
    from lmlab.training.distributed import shutdown

    shutdown(trainer.dist)
    return 0
