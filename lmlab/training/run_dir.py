"""The run directory: what its config.json records (:class:`RunRecord`), and resuming it with
the same settings or a refusal that names what differs.

The Trainer is the one writer of ``config.json``: the :class:`TrainingConfig` (its ``hparams``
and ``speed`` sections) plus a :class:`RunRecord` that the caller (``lmlab.pretrain``,
``lmlab.finetune``) fills with typed fields.

Rerunning ``lmlab pretrain`` on an ``--out`` folder continues the run there. That is only
right when every setting that changes the result is the run's own: the model (family, size,
``model_args``, ``init``), the objective and its arguments, the optimiser and schedule, the
batch, the seed, and the data, which is compared by fingerprint (a hash of the tokenizer's
vocabulary and of the shards' manifest), not by path. Only the stopping rule may change
(extending a finished run). Torch-free, so a mismatch is refused before any work.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmlab.training.config import TrainingConfig

from dataclasses import dataclass, field

from lmlab.utils.errors import LmlabError

# hparams a resumed run may change: its stopping rule (extending a finished run) and the path of
# its shards (the shards' fingerprint, not their path, says whether the data is the same)
RESUMABLE_CHANGES = frozenset({"max_steps", "max_tokens", "budget_seconds", "shards"})
# fingerprints in config.json's ``data`` section (compared only when both runs recorded them)
FINGERPRINTS = ("tokenizer_fingerprint", "shards_fingerprint", "task_fingerprint")


@dataclass
class RunRecord:
    """What a run's ``config.json`` holds beyond its :class:`TrainingConfig`.

    Attributes:
        hparams: result-changing settings the TrainingConfig does not hold (the model's
            ``family``, ``size``, ``init``, ``model_args``; the ``objective`` and its
            ``objective_args``; a fine-tuning run's task and recipe). Written into the
            ``hparams`` section and compared on resume like the TrainingConfig's.
        model: the model's ``TransformerConfig.to_dict()`` (a checkpoint is rebuilt from it).
        objective: ``{"spec": ..., "heads": [...]}``: the objective and the heads it trains.
        data: where the data came from, and its fingerprints (compared on resume).
    """

    hparams: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] | None = None
    objective: dict[str, Any] | None = None
    data: dict[str, Any] = field(default_factory=dict)


def run_config(cfg: TrainingConfig, record: RunRecord | None = None) -> dict[str, Any]:
    """The settings sections of ``config.json``: ``hparams`` (the TrainingConfig's and the
    record's, unset ones left out), ``speed``, and the record's ``model``, ``objective``, ``data``."""
    record = record or RunRecord()
    sections: dict[str, Any] = cfg.to_sections()
    sections["hparams"].update({k: v for k, v in record.hparams.items() if v is not None})
    for name in ("model", "objective"):
        if getattr(record, name) is not None:
            sections[name] = getattr(record, name)
    if record.data:
        sections["data"] = record.data
    return json.loads(json.dumps(sections))  # tuples -> lists, as config.json holds them


def shards_fingerprint(manifest: dict[str, Any]) -> str:
    """A hash of what a token-shard folder holds: its splits (with every file's sha256), dtype
    and tokenizer fingerprint, without paths, so a moved or copied folder keeps it."""
    from lmlab.utils.io import stable_hash

    return stable_hash({"format": manifest.get("format"), "dtype": manifest.get("dtype"),
                        "splits": manifest.get("splits"),
                        "tokenizer": (manifest.get("tokenizer") or {}).get("fingerprint")})


def result_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The settings of a run's ``config.json`` that change its result, as one flat dict: every
    hyperparameter (model, objective and its arguments, optimiser, schedule, batch, seed, ...)
    except :data:`RESUMABLE_CHANGES`, plus the fingerprints of the tokenizer and the shards."""
    flat = {k: v for k, v in (config.get("hparams") or {}).items() if k not in RESUMABLE_CHANGES}
    data = config.get("data") or {}
    flat.update({k: data[k] for k in FINGERPRINTS if k in data})
    return json.loads(json.dumps(flat))  # tuples -> lists, as config.json holds them


def check_resumable(run_dir: str | os.PathLike, config: dict[str, Any]) -> None:
    """Refuse to continue the run in ``run_dir`` with ``config`` (laid out as ``config.json``:
    ``hparams`` and ``data`` sections) when a result-changing setting differs from the run's.

    Runs before any work, so a mismatch leaves ``run_dir`` untouched. A setting missing on one
    side counts as ``None``, except fingerprints, which older runs did not record.
    """
    config_file = Path(run_dir) / "config.json"
    if not config_file.is_file():
        return
    try:
        saved = result_settings(json.loads(config_file.read_text(encoding="utf-8")))
    except (OSError, ValueError) as error:
        raise LmlabError(f"{config_file} cannot be read ({error})",
                         "give a new --out folder, or pass --overwrite to start the run "
                         "over there") from None
    now = result_settings(config)
    changed = sorted(key for key in set(saved) | set(now)
                     if saved.get(key) != now.get(key)
                     and not (key in FINGERPRINTS and (key not in saved or key not in now)))
    if changed:
        diff = "; ".join(f"{key}: {saved.get(key)!r} -> {now.get(key)!r}" for key in changed)
        raise LmlabError(f"{run_dir} holds a run with other settings than this command "
                         f"({diff})", f"resume with the run's settings (see {config_file}), "
                         "give a new --out folder, or pass --overwrite to start the run over")


def prepare_run_folder(out: Path, overwrite: bool, config: dict[str, Any] | None,
                       what: str = "run") -> None:
    """Before any work: refuse an ``out`` folder that holds something else, or a run with
    other result-changing settings (:func:`check_resumable`; ``config=None``: the caller
    checks them itself, once it knows them), unless ``overwrite``; with it, a previous run
    there is removed (by one process under torchrun) and started over. ``what`` names the run
    in the refusal."""
    from lmlab.utils.checks import check_output_folder

    out = Path(out)
    if not (out / "config.json").is_file():
        check_output_folder(out, overwrite, what)
    elif overwrite:
        if int(os.environ.get("RANK", 0)) == 0:
            remove_run(out)
    elif config is not None:
        check_resumable(out, config)


# what a pretraining run writes into its folder (removed when a run is started over)
RUN_OUTPUTS = ("checkpoints", "metrics.jsonl", "config.json", "model", "tokenizer", "report.md",
               "loss.png", "cost.json", "cost.md",
               "context_model")  # quick-thought's second encoder (lmlab.sentence.train)


def remove_run(run_dir: str | os.PathLike) -> None:
    """Remove the outputs of the run in ``run_dir`` (:data:`RUN_OUTPUTS`) so it starts over;
    other files there are left alone. Callers do this only when asked (``--overwrite``)."""
    for name in RUN_OUTPUTS:
        path = Path(run_dir) / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
