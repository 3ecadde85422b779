"""The run directory: what its config.json records (:class:`RunRecord`), and resuming it with
the same result-changing settings or a refusal that names what differs (docs/training.md,
"Checkpoints and exact resume"). Torch-free, so a mismatch is refused before any work.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmlab.training.config import TrainingConfig

from dataclasses import dataclass, field

from lmlab.training.schedules import Schedule
from lmlab.utils.errors import LmlabError

# the stopping rule: a finished run may be extended; an unfinished one keeps it where the
# learning-rate schedule's horizon is built from it (:func:`horizon_change`)
LIMITS = ("max_steps", "max_tokens", "budget_seconds")
# hparams a resumed run may change: its stopping rule (above) and the path of its shards (the
# shards' fingerprint, not their path, says whether the data is the same)
RESUMABLE_CHANGES = frozenset({*LIMITS, "shards"})
# fingerprints in config.json's ``data`` section (compared only when both runs recorded them)
FINGERPRINTS = ("tokenizer_fingerprint", "shards_fingerprint", "task_fingerprint",
                "corpus_fingerprint")  # the last: word2vec's and GloVe's (training.loop_run)


@dataclass
class RunRecord:
    """What a run's ``config.json`` holds beyond its :class:`TrainingConfig`: result-changing
    ``hparams`` (model, objective, task, recipe: compared on resume), the ``model`` config a
    checkpoint is rebuilt from, the ``objective`` (spec and heads) and the ``data`` (sources and
    fingerprints)."""

    hparams: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] | None = None
    objective: dict[str, Any] | None = None
    data: dict[str, Any] = field(default_factory=dict)


def run_config(cfg: TrainingConfig, record: RunRecord | None = None) -> dict[str, Any]:
    """The settings sections of ``config.json`` from ``cfg`` and ``record``."""
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
    """A hash of a token-shard folder's contents, without paths (a moved folder keeps it)."""
    from lmlab.utils.io import stable_hash

    return stable_hash({"format": manifest.get("format"), "dtype": manifest.get("dtype"),
                        "splits": manifest.get("splits"),
                        "tokenizer": (manifest.get("tokenizer") or {}).get("fingerprint")})


def result_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The settings of a ``config.json`` that change the result, flat: the hparams (less
    :data:`RESUMABLE_CHANGES`), the precision and the data's fingerprints."""
    flat = {k: v for k, v in (config.get("hparams") or {}).items() if k not in RESUMABLE_CHANGES}
    flat["precision"] = (config.get("speed") or {}).get("precision")
    data = config.get("data") or {}
    flat.update({k: data[k] for k in FINGERPRINTS if k in data})
    return json.loads(json.dumps(flat))  # tuples -> lists, as config.json holds them


STEP_DIR = re.compile(r"^step-(\d+)$")


def list_checkpoints(checkpoints_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints as (step, folder), oldest first."""
    if not checkpoints_dir.is_dir():
        return []
    found = []
    for child in checkpoints_dir.iterdir():
        match = STEP_DIR.match(child.name)
        if match and child.is_dir() and (child / "state.json").is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def has_ended(run_dir: str | os.PathLike, hparams: dict[str, Any]) -> bool:
    """Whether the run in ``run_dir`` has ended: its newest checkpoint records a stop reason (or,
    written before they were, reached a limit of ``hparams``)."""
    found = list_checkpoints(Path(run_dir) / "checkpoints")
    if not found:
        return False
    state = json.loads((found[-1][1] / "state.json").read_text(encoding="utf-8"))
    if "stop_reason" in state:
        return bool(state["stop_reason"])
    reached = (("max_steps", "step"), ("max_tokens", "tokens"), ("budget_seconds", "elapsed"))
    return any(hparams.get(limit) is not None and state.get(key, 0) >= hparams[limit]
               for limit, key in reached)


def horizon_change(run_dir: str | os.PathLike, saved: dict[str, Any],
                   now: dict[str, Any]) -> list[str]:
    """The limits that differ between ``saved`` and ``now`` hparams where that changes the
    result: the run has not ended and its schedule's horizon is built from them."""
    changed = [k for k in LIMITS if saved.get(k) != now.get(k)]
    if not changed or has_ended(run_dir, saved):
        return []
    shape = ("warmup_steps", "warmup_fraction", "min_lr_ratio", "cut_frac", "ratio")
    schedule = Schedule(saved.get("schedule", "linear"),
                        **{k: saved[k] for k in shape if k in saved})
    return changed if schedule.uses_horizon else []


def check_resumable(run_dir: str | os.PathLike, config: dict[str, Any],
                    option: str = "--out") -> None:
    """Refuse to continue the run in ``run_dir`` with ``config`` (laid out as ``config.json``)
    when a result-changing setting differs; ``option`` names the folder's flag. A fingerprint
    missing on one side, or an ``"auto"`` precision, is not compared."""
    config_file = Path(run_dir) / "config.json"
    if not config_file.is_file():
        return
    try:
        saved_config = json.loads(config_file.read_text(encoding="utf-8"))
        saved = result_settings(saved_config)
    except (OSError, ValueError) as error:
        raise LmlabError(f"{config_file} cannot be read ({error})",
                         f"give a new {option} folder, or pass --overwrite to start the "
                         "run over there") from None
    now = result_settings(config)
    if now["precision"] == "auto":
        now["precision"] = saved["precision"]
    saved_hparams, now_hparams = saved_config.get("hparams") or {}, config.get("hparams") or {}
    limits = horizon_change(run_dir, saved_hparams, now_hparams)
    for key in limits:
        saved[key], now[key] = saved_hparams.get(key), now_hparams.get(key)
    changed = sorted(key for key in set(saved) | set(now)
                     if saved.get(key) != now.get(key)
                     and not (key in FINGERPRINTS and (key not in saved or key not in now)))
    if changed:
        diff = "; ".join(f"{key}: {saved.get(key)!r} -> {now.get(key)!r}" for key in changed)
        why = (" (it has not reached its end, and its learning-rate schedule is built on its "
               "limits)" if limits else "")
        finish = "; to run longer, finish it first, then extend it" if limits else ""
        raise LmlabError(f"{run_dir} holds a run with other settings than this command "
                         f"({diff}){why}", f"resume with the run's settings (see {config_file})"
                         f"{finish}, give a new {option} folder, or pass --overwrite to start "
                         "the run over")


def prepare_run_folder(out: Path, overwrite: bool, config: dict[str, Any] | None,
                       what: str = "run", option: str = "--out") -> None:
    """Refuse an ``out`` folder that holds something else, or a run with other settings
    (``config=None``: the caller checks later), unless ``overwrite``, which starts it over."""
    from lmlab.utils.checks import check_output_folder

    out = Path(out)
    if not (out / "config.json").is_file():
        check_output_folder(out, overwrite, what, option=option)
    elif overwrite:
        if int(os.environ.get("RANK", 0)) == 0:
            remove_run(out)
    elif config is not None:
        check_resumable(out, config, option)


# what a pretraining run writes into its folder (removed when a run is started over)
RUN_OUTPUTS = ("checkpoints", "metrics.jsonl", "config.json", "model", "tokenizer", "report.md",
               "loss.png", "cost.json", "cost.md",
               "context_model")  # quick-thought's second encoder (lmlab.sentence.train)


def remove_run(run_dir: str | os.PathLike) -> None:
    """Remove the run's outputs (:data:`RUN_OUTPUTS`) so it starts over; other files stay. Its
    cost records are kept apart (``cost-sessions.started-over-N.jsonl``): what it spent stays
    counted by ``lmlab cost project``, not as the new run's."""
    from lmlab.cost.report import SESSIONS_FILE, STARTED_OVER

    sessions = Path(run_dir) / SESSIONS_FILE
    if sessions.is_file():
        number = 1 + len(list(Path(run_dir).glob(STARTED_OVER.format("*"))))
        sessions.rename(sessions.with_name(STARTED_OVER.format(number)))
    for name in RUN_OUTPUTS:
        path = Path(run_dir) / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
