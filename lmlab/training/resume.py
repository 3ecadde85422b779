"""Resuming a run directory: the same settings, or a refusal that names what differs.

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
from typing import Any

from lmlab.utils.errors import LmlabError

# hparams a resumed run may change: its stopping rule (extending a finished run) and the path of
# its shards (the shards' fingerprint, not their path, says whether the data is the same)
RESUMABLE_CHANGES = frozenset({"max_steps", "max_tokens", "budget_seconds", "shards"})
# fingerprints in config.json's ``data`` section (compared only when both runs recorded them)
FINGERPRINTS = ("tokenizer_fingerprint", "shards_fingerprint")


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


# what a pretraining run writes into its folder (removed when a run is started over)
RUN_OUTPUTS = ("checkpoints", "metrics.jsonl", "config.json", "model", "tokenizer", "report.md",
               "loss.png", "cost.json", "cost.md")


def remove_run(run_dir: str | os.PathLike) -> None:
    """Remove the outputs of the run in ``run_dir`` (:data:`RUN_OUTPUTS`) so it starts over;
    other files there are left alone. Callers do this only when asked (``--overwrite``)."""
    for name in RUN_OUTPUTS:
        path = Path(run_dir) / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
