"""``lmlab.pretrain(config)``: pretrain (or continue pretraining) a model with an objective on
token shards. :class:`PretrainConfig` maps a config file's ``hparams:``, ``speed:`` and
``cost:`` sections; docs/training.md tells the story."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmlab.data.mixture import parse_mix
from lmlab.training.config import TrainingConfig, load_config_file
from lmlab.training.run_dir import RunRecord
from lmlab.utils.errors import LmlabError

if TYPE_CHECKING:
    from lmlab.models.model import LanguageModel
    from lmlab.tokenization.tokenizer import Tokenizer
    from lmlab.training.trainer import TrainResult

# keys of a config file's hparams: section that describe the model, objective and data (the
# others are TrainingConfig fields); recorded in config.json and compared on resume
RUN_HPARAMS = ("family", "size", "objective", "objective_args", "shards", "init", "model_args",
               "eval_batches", "seq_len_schedule", "batch_ramp_tokens", "batch_ramp_start", "mix")
# settings of the run itself, not of a config file's sections
RUN_OWN = ("out", "tokenizer", "overwrite", "track_cost")


@dataclass
class ModelSettings:
    """A preset ``family`` and ``size`` (``model_args`` override its config), or the weights of
    ``init`` (a run, checkpoint or model folder, or a short name such as ``minilm``)."""

    family: str | None = None
    size: str | None = None
    init: str | None = None
    model_args: dict[str, Any] = field(default_factory=dict)


@dataclass
class ObjectiveSettings:
    """The objective(s), comma-separated (``"mlm,sop"``), and keyword arguments for them."""

    spec: str = "mlm"
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class DataSettings:
    """The token-shard folder, its tokenizer (default: the one the shards record), how many
    validation batches to evaluate, and the stream's shape over the run (docs/training.md):
    BERT's ``seq_len_schedule`` (``"128:0.9,512:0.1"``, fractions of steps; ``seq_len`` is its
    longest), GPT-3's batch ramp (from ``batch_ramp_start`` tokens to the full batch over the
    first ``batch_ramp_tokens``) and the ``mix`` of corpus sources (``"kjv=0.3,wordnet=0.7"``)."""

    shards: str | Path | None = None
    tokenizer: str | None = None
    eval_batches: int = 8
    seq_len_schedule: str | None = None
    batch_ramp_tokens: int | None = None
    batch_ramp_start: int = 32768  # GPT-3's 32k tokens
    mix: str | dict[str, float] | None = None


@dataclass
class CostSettings:
    """The cost report's price per device-hour and grid intensity (g CO2e/kWh)."""

    price_per_hour: float | None = None
    grid_g_per_kwh: float | None = None


@dataclass
class PretrainConfig:
    """Everything :func:`pretrain` needs. Rerunning on ``out`` resumes its run unless
    ``overwrite``; ``track_cost=False`` skips the cost report."""

    out: str | Path
    training: TrainingConfig
    model: ModelSettings = field(default_factory=ModelSettings)
    objective: ObjectiveSettings = field(default_factory=ObjectiveSettings)
    data: DataSettings = field(default_factory=DataSettings)
    cost: CostSettings = field(default_factory=CostSettings)
    overwrite: bool = False
    track_cost: bool = True

    # -- config files ----------------------------------------------------------------------------
    @classmethod
    def from_sections(cls, sections: dict[str, Any] | None = None,
                      **overrides: Any) -> PretrainConfig:
        """A config from a config file's sections with ``overrides`` on top (a setting's name,
        or ``out``/``tokenizer``/``overwrite``/``track_cost``; ``None`` ones are ignored). Counts
        (``"5M"``), durations (``"10m"``) and ``warmup`` (steps, or a fraction) read as in a file.
        """
        given = {k: v for k, v in overrides.items() if v is not None}
        own = {k: given.pop(k) for k in RUN_OWN if k in given}
        merged = {name: dict((sections or {}).get(name) or {})
                  for name in ("hparams", "speed", "cost")}
        for key, value in given.items():
            merged[_section_of(key)][key] = value
        hparams = _parse_counts(merged["hparams"])
        if hparams.get("seq_len_schedule") and "seq_len" not in hparams:  # its longest length
            from lmlab.cost.flops import parse_seq_len_schedule

            hparams["seq_len"] = max(n for n, _ in parse_seq_len_schedule(
                hparams["seq_len_schedule"]))
        known = set(TrainingConfig.field_names())
        unknown = sorted((set(hparams) - known - set(RUN_HPARAMS)) | (set(merged["speed"]) - known))
        if unknown:
            raise LmlabError(f"unknown settings: {', '.join(unknown)}",
                             f"known: {', '.join(sorted(known | set(RUN_HPARAMS)))}")
        training = TrainingConfig.from_sections(
            {"hparams": {k: v for k, v in hparams.items() if k in known},
             "speed": merged["speed"]})
        from lmlab.cost.report import cost_settings

        for key in ("objective_args", "model_args"):
            _check_mapping(key, hparams.get(key))
        return cls(
            out=own.get("out", ""), training=training,
            model=ModelSettings(hparams.get("family"), hparams.get("size"), hparams.get("init"),
                                dict(hparams.get("model_args") or {})),
            objective=ObjectiveSettings(hparams.get("objective") or "mlm",
                                        dict(hparams.get("objective_args") or {})),
            data=DataSettings(hparams.get("shards"), own.get("tokenizer"),
                              8 if hparams.get("eval_batches") is None else hparams["eval_batches"],
                              hparams.get("seq_len_schedule"), hparams.get("batch_ramp_tokens"),
                              hparams.get("batch_ramp_start") or 32768, hparams.get("mix")),
            cost=CostSettings(**cost_settings(merged["cost"])),
            overwrite=bool(own.get("overwrite", False)),
            track_cost=bool(own.get("track_cost", True)))

    @classmethod
    def from_file(cls, path: str | Path, **overrides: Any) -> PretrainConfig:
        """A config from a YAML or JSON file, ``overrides`` on top (see :meth:`from_sections`)."""
        return cls.from_sections(load_config_file(path), **overrides)

    def to_sections(self) -> dict[str, dict[str, Any]]:
        """The config file's sections (JSON-able); :meth:`from_sections` reads them back."""
        sections = self.training.to_sections()
        sections["hparams"].update(self.run_hparams())
        sections["cost"] = {k: v for k, v in dataclasses.asdict(self.cost).items()
                            if v is not None}
        return sections

    def run_hparams(self) -> dict[str, Any]:
        """The result-changing settings beyond the TrainingConfig: the :data:`RUN_HPARAMS`."""
        return {"family": self.model.family, "size": self.model.size,
                "objective": self.objective.spec, "objective_args": self.objective.args or None,
                "shards": None if self.data.shards is None else str(self.data.shards),
                "init": self.model.init, "model_args": self.model.model_args or None,
                "eval_batches": self.data.eval_batches,
                "seq_len_schedule": self.data.seq_len_schedule,
                "batch_ramp_tokens": self.data.batch_ramp_tokens,
                "batch_ramp_start": self.data.batch_ramp_tokens and self.data.batch_ramp_start,
                "mix": None if not self.data.mix else parse_mix(self.data.mix)}

    # -- checks ----------------------------------------------------------------------------------
    def validate(self) -> None:
        """Check every setting before any work."""
        from lmlab.cost.report import cost_settings
        from lmlab.models.presets import preset
        from lmlab.objectives.registry import check_objective_spec
        from lmlab.utils.catalog import resolve_short_name
        from lmlab.utils.checks import check_at_least, check_folder

        self.training.validate()
        cost_settings(dataclasses.asdict(self.cost))
        if not self.data.shards:
            raise LmlabError("no training data given",
                             "pass --shards DIR (from `lmlab data tokenize`)")
        check_folder(self.data.shards, "--shards", "give the folder written by `lmlab data "
                     "tokenize --out SHARDS`", holds="manifest.json", what="token-shard folder")
        check_objective_spec(self.objective.spec)
        _check_mapping("objective_args", self.objective.args)
        _check_mapping("model_args", self.model.model_args)
        check_at_least(self.data.eval_batches, 1, "--eval-batches")
        self._check_stream_shape()
        tokenizer = self.data.tokenizer
        if tokenizer is not None and not resolve_short_name(tokenizer).exists():
            raise LmlabError(f"--tokenizer {tokenizer} does not exist",
                             "give the tokenizer folder the shards were written with")
        seq_len, family, size = self.training.seq_len, self.model.family, self.model.size
        if self.model.init:
            if not resolve_short_name(self.model.init).exists():
                raise LmlabError(f"--init {self.model.init} does not exist", "give a run "
                                 "directory, a checkpoint folder, a Hugging Face model folder or "
                                 "a short name from `lmlab models list`")
            from lmlab.interop.folders import source_kind

            if source_kind(self.model.init) == "quantized":
                raise LmlabError(f"--init {self.model.init} is an int8-quantised model (lmlab "
                                 "quantize): its linear layers hold no trainable weights",
                                 "start from (or distil) the fp32 model")
        elif not family or not size:
            raise LmlabError("no model given", "pass --family and --size (or --init PATH)")
        else:
            from lmlab.models.rnn.config import check_family_objective

            check_family_objective(family, self.objective.spec)  # elmo: bilm; awd-lstm: clm
            if self.training.lr_decay and family not in ("awd-lstm", "elmo"):
                raise LmlabError(f"lr_decay sets ULMFiT's rate per layer group, which lmlab "
                                 f"pretrain defines for awd-lstm and elmo, not {family}",
                                 "drop lr_decay, or use --family awd-lstm")
            config = preset(family, size, **self.model.model_args)
            if config.extra.get("patch_size"):  # ViT: models/core/image_embeddings.py
                raise LmlabError(f"{family} reads images (pixel values), and lmlab pretrain "
                                 "trains on token shards with a text objective",
                                 "pretrain a text family; for images load a ViT checkpoint "
                                 "(docs/vision.md)")
            if family == "canine" and check_objective_spec(self.objective.spec) != ["canine-c"]:
                raise LmlabError(f"CANINE reads characters and a {self.objective.spec!r} head "
                                 "would predict 1.1M codepoints", "pretrain it with --objective "
                                 "canine-c, its autoregressive character loss (docs/characters.md)")
            positions = config.max_position_embeddings
            if config.is_encoder_decoder:  # the offset rows hold no position; </s> is added
                positions -= config.position_offset + 1
            if positions < seq_len and config.position_embedding != "relative":
                raise LmlabError(f"--seq-len {seq_len} exceeds the {family}-{size} model's "
                                 f"{positions} positions", f"use --seq-len {positions} or less")
        if not self.out:
            raise LmlabError("no run directory given", "pass --out DIR (out= in Python)")
        if Path(self.out).exists() and not Path(self.out).is_dir():
            raise LmlabError(f"--out {self.out} is a file", "give the path of a run folder")


    def _check_stream_shape(self) -> None:
        """The sequence-length schedule, batch ramp and source mixture, against the run."""
        from lmlab.data.mixture import check_mix
        from lmlab.utils.checks import check_at_least
        from lmlab.utils.io import read_json

        cfg, data = self.training, self.data
        phases = self.phase_steps() or []
        for phase, steps in enumerate(phases):
            if steps is None:  # the last phase: what the others leave of the run
                steps = cfg.max_steps - sum(phases[:-1]) if cfg.max_steps else 1  # type: ignore[arg-type]
            if steps < 1:
                raise LmlabError(f"phase {phase + 1} of --seq-len-schedule "
                                 f"{data.seq_len_schedule} gets no step of {cfg.max_steps}",
                                 "give more --steps or larger fractions")
        check_at_least(data.batch_ramp_tokens, 1, "--batch-ramp")
        check_at_least(data.batch_ramp_start, 1, "--batch-ramp-start")
        if data.batch_ramp_tokens and data.batch_ramp_start >= cfg.batch_size * cfg.seq_len:
            raise LmlabError(f"--batch-ramp-start {data.batch_ramp_start} tokens is not below "
                             f"the full batch ({cfg.batch_size} x {cfg.seq_len} = "
                             f"{cfg.batch_size * cfg.seq_len} tokens): nothing to ramp",
                             "give a smaller --batch-ramp-start or a larger --batch-size")
        if data.mix:
            split = read_json(Path(data.shards) / "manifest.json").get("splits", {}).get(  # type: ignore[arg-type]
                "train", {})
            check_mix(parse_mix(data.mix), (split.get("sources") or {}).get("names"),
                      f"{data.shards}'s train split")

    def phase_steps(self) -> list[int | None] | None:
        """Optimizer steps of each phase of the sequence-length schedule (None for the last,
        which runs to the end), or None without a schedule; the schedule's longest length must
        be ``training.seq_len`` and its fractions need ``max_steps``."""
        from lmlab.cost.flops import parse_seq_len_schedule

        if not self.data.seq_len_schedule:
            return None
        phases = parse_seq_len_schedule(self.data.seq_len_schedule)
        longest, steps = max(n for n, _ in phases), self.training.max_steps
        if longest != self.training.seq_len:
            raise LmlabError(f"--seq-len {self.training.seq_len} is not the longest length of "
                             f"--seq-len-schedule {self.data.seq_len_schedule}",
                             f"leave --seq-len out (it is then {longest}) or give {longest}")
        if len(phases) > 1 and steps is None:
            raise LmlabError("--seq-len-schedule's fractions are of optimizer steps, and the run "
                             "has no step count", "give --steps (e.g. --steps 1000)")
        return [None if i == len(phases) - 1 else round(share * steps)  # type: ignore[operator]
                for i, (_, share) in enumerate(phases)]


def _section_of(key: str) -> str:
    """The config-file section a setting belongs to (an unknown name is refused)."""
    from lmlab.cost.report import COST_SETTINGS

    if key in RUN_HPARAMS or key == "warmup":
        return "hparams"
    if key in COST_SETTINGS:
        return "cost"
    try:
        return TrainingConfig.section_of(key)
    except KeyError:
        raise LmlabError(f"unknown setting {key!r}", "known: " + ", ".join(sorted(
            {*TrainingConfig.field_names(), *RUN_HPARAMS, *COST_SETTINGS, *RUN_OWN}))) from None


def _parse_counts(hparams: dict[str, Any]) -> dict[str, Any]:
    """``hparams`` with counts, durations and the ``warmup`` shorthand read into fields."""
    from lmlab.utils.durations import parse_count, parse_duration

    hparams = dict(hparams)
    for key in ("max_steps", "max_tokens", "batch_ramp_tokens", "batch_ramp_start"):
        if hparams.get(key) is not None:
            hparams[key] = parse_count(hparams[key])
    if hparams.get("budget_seconds") is not None:
        hparams["budget_seconds"] = parse_duration(hparams["budget_seconds"])
    warmup = hparams.pop("warmup", None)
    if warmup is None:
        return hparams
    try:
        value = float(warmup)
    except ValueError:
        raise LmlabError(f"cannot read the warmup {warmup!r}",
                         "give optimizer steps (e.g. --warmup 500) or a fraction of the "
                         "run (e.g. --warmup 0.06)") from None
    if not 0 <= value < float("inf"):  # nan and inf too
        raise LmlabError(f"--warmup must be a number >= 0, got {warmup}", "use e.g. 0.06 or 500")
    if 0 < value < 1:
        hparams["warmup_fraction"] = value
    else:
        hparams["warmup_steps"] = int(value)
    return hparams


def _check_mapping(key: str, value: Any) -> None:
    if not isinstance(value or {}, dict):
        raise LmlabError(f"{key} must be a mapping of names to values, got {value!r}",
                         f"write {key}: as a YAML mapping")


# -- the pieces of a run ---------------------------------------------------------------------------
def find_tokenizer(shards: Path, override: str | None) -> tuple[Tokenizer, Path]:
    """The tokenizer the shards were written with and its folder (``override``, or the one the
    manifest records), checked by fingerprint."""
    from lmlab.tokenization.tokenizer import Tokenizer
    from lmlab.utils.catalog import resolve_short_name
    from lmlab.utils.io import read_json

    shards = Path(shards)
    manifest_path = shards / "manifest.json"
    if not manifest_path.is_file():
        raise LmlabError(f"{shards} has no manifest.json", "build shards with `lmlab data "
                         "tokenize --tokenizer T --corpus DIR --out SHARDS`")
    info = read_json(manifest_path).get("tokenizer", {})
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


def build_model(settings: ModelSettings, tokenizer: Tokenizer, seq_len: int) -> LanguageModel:
    """A fresh preset model sized to the tokenizer, or the ``init`` weights (refused when
    ``seq_len`` exceeds their positions)."""
    from lmlab.models.classes import model_class
    from lmlab.models.presets import preset

    if settings.init:
        model = load_init(Path(settings.init), len(tokenizer))
        positions = model.config.max_position_embeddings
        if positions < seq_len:
            raise LmlabError(f"--seq-len {seq_len} exceeds the --init model's {positions} "
                             "positions", f"use --seq-len {positions} or less")
        return model
    overrides = dict(settings.model_args)
    overrides.setdefault("vocab_size", len(tokenizer))
    if tokenizer.pad_token_id is not None:
        overrides.setdefault("pad_token_id", tokenizer.pad_token_id)
    config = preset(settings.family, settings.size, **overrides)
    if settings.family in ("awd-lstm", "elmo"):  # recurrent: lmlab.models.rnn
        from lmlab.interop.recurrent import build_model as build_recurrent

        return build_recurrent(config, tokenizer=tokenizer)  # ELMo reads the vocabulary's chars
    if config.is_encoder_decoder:
        from lmlab.models.seq2seq import EncoderDecoderModel, decoder_start_token

        if tokenizer.eos_token_id is not None:  # generation stops there
            config.eos_token_id = tokenizer.eos_token_id
        config.extra["decoder_start_token_id"] = decoder_start_token(config.family, tokenizer)
        return EncoderDecoderModel(config, heads=())
    return model_class(config)(config, heads=())  # CANINE: a stack of its own


def load_init(path: Path, vocab_size: int) -> LanguageModel:
    """Weights to start from: a checkpoint folder, a run directory or a model folder."""
    from lmlab.interop.folders import load_model
    from lmlab.models.classes import build_model
    from lmlab.models.config import TransformerConfig
    from lmlab.models.rnn.config import FAMILIES as RECURRENT_FAMILIES
    from lmlab.models.rnn.config import RecurrentConfig
    from lmlab.training import checkpoint as ckpt
    from lmlab.utils.io import read_json

    if (path / "checkpoints").is_dir() and not (path / "model").is_dir():
        latest = ckpt.latest_checkpoint(path / "checkpoints")
        if latest is None:
            raise LmlabError(f"{path} has no complete checkpoint", "point --init at a finished run")
        path = latest
    if (path / "state.json").is_file():  # a checkpoint folder: config from its run
        run_config = read_json(path.parent.parent / "config.json")
        state = ckpt.load_state(path / "model.safetensors")
        heads = sorted({k.split(".")[1] for k in state if k.startswith("heads.")})
        if run_config["model"].get("family") in RECURRENT_FAMILIES:  # AWD-LSTM, ELMo
            from lmlab.interop.recurrent import add_zero_softmax_bias
            from lmlab.interop.recurrent import build_model as build_recurrent

            model = build_recurrent(RecurrentConfig.from_dict(run_config["model"]), heads)
            add_zero_softmax_bias(model, state)  # a run saved before the softmax had its bias
        else:
            model = build_model(TransformerConfig.from_dict(run_config["model"]), heads, state)
        ckpt.load_into(model, state, path)
    else:
        target = path / "model" if (path / "model" / "config.json").is_file() else path
        model = load_model(target)
        model.train()
    if model.config.vocab_size != vocab_size:
        raise LmlabError(f"--init model has {model.config.vocab_size} tokens but the shards' "
                         f"tokenizer has {vocab_size}", "tokenize the corpus with the "
                         "checkpoint's own tokenizer (its folder) and pass those shards")
    print(f"lmlab: initialised from {path} ({model.num_parameters():,} parameters)", flush=True)
    return model


def _data_record(config: PretrainConfig, tokenizer: Tokenizer,
                 tokenizer_dir: Path) -> dict[str, Any]:
    """``config.json``'s ``data`` section: sources and the fingerprints resuming compares."""
    from lmlab.training.run_dir import shards_fingerprint
    from lmlab.utils.io import read_json

    shards = Path(config.data.shards)  # type: ignore[arg-type]
    return {"shards": str(shards), "tokenizer": str(tokenizer_dir),
            "tokenizer_fingerprint": tokenizer.fingerprint(),
            "shards_fingerprint": shards_fingerprint(read_json(shards / "manifest.json"))}


def _model_and_objective(config: PretrainConfig, tokenizer: Tokenizer) -> tuple[Any, Any]:
    """The model and the objective, with the heads the objective trains added to the model."""
    from lmlab.objectives.registry import build_objective
    from lmlab.objectives.special_tokens import SpecialTokens

    model = build_model(config.model, tokenizer, config.training.seq_len)
    args = dict(config.objective.args)
    if isinstance(args.get("teacher"), str | Path):  # a config file names the teacher's folder
        from lmlab.utils.catalog import resolve_short_name

        args["teacher"] = load_init(resolve_short_name(args["teacher"]), len(tokenizer))
    objective = build_objective(config.objective.spec, SpecialTokens.from_tokenizer(tokenizer),
                                **args)
    before = set(model.heads.keys())
    if hasattr(objective, "prepare"):
        objective.prepare(model)
    added = [name for name in model.heads.keys() if name not in before]
    if added and config.model.init:
        print(f"lmlab: the --init checkpoint has no {', '.join(added)} head; added a freshly "
              f"initialised one for {config.objective.spec}", flush=True)
    return model, objective


def _streams(config: PretrainConfig, objective: Any) -> tuple[Any, list[dict[str, Any]]]:
    """The training stream and the fixed validation batches (none without a validation split)."""
    from lmlab.data.pretraining import PretrainingStream, validation_batches

    cfg, data, shards = config.training, config.data, Path(config.data.shards)  # type: ignore[arg-type]
    ramp = (data.batch_ramp_start, data.batch_ramp_tokens) if data.batch_ramp_tokens else None

    def train_stream(seq_len: int) -> PretrainingStream:
        return PretrainingStream(shards, split="train", objective=objective,
                                 batch_size=cfg.batch_size, seq_len=seq_len, seed=cfg.seed,
                                 workers=cfg.workers, mix=data.mix, batch_ramp=ramp,
                                 batch_multiple=int(os.environ.get("WORLD_SIZE", 1)))

    steps = config.phase_steps()
    if steps is None:
        stream = train_stream(cfg.seq_len)
    else:  # BERT's schedule: one stream per length, each for its phase's micro-batches
        from lmlab.cost.flops import parse_seq_len_schedule
        from lmlab.data.phases import PhasedStream

        lengths = [n for n, _ in parse_seq_len_schedule(data.seq_len_schedule)]  # type: ignore[arg-type]
        stream = PhasedStream([train_stream(n) for n in lengths],
                              [None if n is None else n * cfg.grad_accum for n in steps])
    first = getattr(stream, "streams", [stream])[0]
    if first.mixture is not None and int(os.environ.get("RANK", 0)) == 0:
        mixture, units = first.mixture, ("documents" if first.format == "segment_pairs"
                                         else "windows")
        print("lmlab: source mixture: " + ", ".join(
            f"{name} {100 * p:g}% of the examples (its {len(pool):,} {units})"
            for name, p, pool in zip(mixture.names, mixture.p, mixture.pools)), flush=True)
    try:
        return stream, validation_batches(shards, objective=objective, batch_size=cfg.batch_size,
                                          seq_len=cfg.seq_len, seed=1234,
                                          max_batches=int(config.data.eval_batches))
    except LmlabError as error:
        print(f"lmlab: no validation batches ({error.problem}); evaluation is skipped",
              flush=True)
        return stream, []


def start_run(config: PretrainConfig, hparams: dict[str, Any] | None = None,
              check: Callable[[Tokenizer], Any] | None = None, what: str = "run"
              ) -> tuple[Tokenizer, Path, RunRecord, Any]:
    """The start of a run on shards (:func:`pretrain`, distillation): check ``config``, find the
    shards' tokenizer, call ``check(tokenizer)`` (a caller's own checks, before the run folder
    is touched), prepare the run folder, wait for every rank, set threads and seed. Returns the
    tokenizer, its folder, the run's record (``hparams`` added) and what ``check`` returned."""
    import torch

    from lmlab.training.distributed import barrier, init_distributed, process_device
    from lmlab.training.run_dir import prepare_run_folder, run_config
    from lmlab.training.trainer import seed_everything

    config.validate()
    cfg = config.training
    device = process_device(cfg.device)  # a GPU that is not there: refused before any work
    tokenizer, tokenizer_dir = find_tokenizer(Path(config.data.shards),  # type: ignore[arg-type]
                                              config.data.tokenizer)
    record = RunRecord(hparams={**config.run_hparams(), **(hparams or {})},
                       data=_data_record(config, tokenizer, tokenizer_dir))
    checked = None if check is None else check(tokenizer)
    prepare_run_folder(Path(config.out), config.overwrite, run_config(cfg, record), what=what)
    # under torchrun: no rank writes into --out (rank 0 copies the tokenizer in
    # train_on_shards, or has removed the old run with overwrite) before every rank has checked it
    barrier(init_distributed(device))
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    return tokenizer, tokenizer_dir, record, checked


def pretrain(config: PretrainConfig) -> TrainResult:
    """Pretrain as ``config`` says (every setting and the run folder checked first); returns
    how the run ended. Under torchrun every rank calls this."""
    tokenizer, tokenizer_dir, record, _ = start_run(config)
    model, objective = _model_and_objective(config, tokenizer)
    return train_on_shards(config, model, objective, record, tokenizer_dir)


def train_on_shards(config: PretrainConfig, model: Any, objective: Any, record: RunRecord,
                    tokenizer_dir: Path) -> TrainResult:
    """Train ``model`` with ``objective`` on ``config``'s shards into the prepared run folder
    (the end of :func:`pretrain` and of distillation)."""
    from lmlab.training.distributed import shutdown
    from lmlab.training.report import copy_tokenizer
    from lmlab.training.trainer import Trainer

    out, cfg = Path(config.out), config.training
    stream, eval_batches = _streams(config, objective)
    if not (out / "tokenizer").exists() and int(os.environ.get("RANK", 0)) == 0:
        copy_tokenizer(tokenizer_dir, out / "tokenizer")
    record.model = model.config.to_dict()
    record.objective = {"spec": config.objective.spec, "heads": list(model.heads.keys())}
    trainer = Trainer(model, objective, stream, cfg, out, eval_batches=eval_batches,
                      record=record, tokenizer_dir=out / "tokenizer",
                      track_cost=config.track_cost,
                      cost_settings={k: v for k, v in dataclasses.asdict(config.cost).items()
                                     if v is not None})
    try:
        return trainer.train()
    finally:
        shutdown(trainer.dist)
