"""What a finished run leaves for people: the final model folder and ``report.md`` (summary,
settings, last evaluation, loss curve, cost); :func:`run_summary` reads a run still in progress.
"""

from __future__ import annotations

import shutil
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2

from lmlab.training.metrics_log import read_metrics
from lmlab.utils.io import atomic_path, atomic_write_text, read_json

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.txt", "vocab.json", "merges.txt", "spiece.model")


def copy_tokenizer(tokenizer_dir: Path, target: Path) -> None:
    """Copy the tokenizer files of ``tokenizer_dir`` (or the file itself) into ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    sources = [tokenizer_dir] if tokenizer_dir.is_file() else [
        tokenizer_dir / name for name in TOKENIZER_FILES if (tokenizer_dir / name).is_file()]
    for source in sources:
        with atomic_path(target / source.name) as tmp:
            shutil.copyfile(source, tmp)


def save_final_model(model: Any, path: Path, tokenizer_dir: Path | None = None) -> Path:
    """Write the trained model as a loadable folder (+ tokenizer files)."""
    from lmlab.interop.native import save_model

    path, _ = save_model(model, Path(path))
    if tokenizer_dir is not None and Path(tokenizer_dir).exists():
        copy_tokenizer(Path(tokenizer_dir), path)
    return path


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display needed): the one plot helper."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig: Any, path: str | Path, dpi: int = 100) -> Path:
    """Write ``fig`` to ``path`` as a PNG (atomically) and close it."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi)
    pyplot().close(fig)
    return Path(path)


def plot_losses(records: list[dict[str, Any]], path: Path, minutes: bool = False,
                level: tuple[float, str] | None = None) -> Path | None:
    """Training (and validation) loss against tokens or wall-time minutes as a PNG, with an
    optional dashed reference ``level`` (value, label); None when there is nothing."""
    train = [r for r in records if r.get("kind") == "train" and isinstance(r.get("loss"), float)]
    if not train:
        return None
    plt = pyplot()

    def x(record: dict[str, Any]) -> float:
        return record.get("elapsed", 0) / 60 if minutes else record["tokens"]

    evals = [r for r in records if r.get("kind") == "eval" and "eval_loss" in r]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot([x(r) for r in train], [r["loss"] for r in train], label="train loss", lw=1)
    if evals:
        ax.plot([x(r) for r in evals], [r["eval_loss"] for r in evals], "o-",
                label="validation loss")
    if level is not None:
        ax.axhline(level[0], ls="--", color="grey", label=level[1])
    ax.set_xlabel("wall time (minutes)" if minutes else "tokens")
    ax.set_ylabel("loss (nats)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return save_png(fig, path)


def run_summary(run_dir: Path) -> dict[str, Any]:
    """Steps, tokens, time, stop reason, last loss and last evaluation of a run, from its files
    (the counts from the newest record of any kind: the last train record may lag)."""
    run_dir = Path(run_dir)
    records = read_metrics(run_dir / "metrics.jsonl")
    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval"]
    diverged = [r for r in records if r.get("kind") == "diverged"]
    progress = [r for r in records if r.get("kind") in ("train", "eval", "end")]
    newest: dict[str, Any] = {}
    for record in progress:  # the last record of the highest step (a resumed run repeats steps)
        if int(record.get("step", 0)) >= int(newest.get("step", 0)):
            newest = record
    last = train[-1] if train else {}
    tps = [r["tokens_per_s"] for r in train[1:] if "tokens_per_s" in r] or \
        [r["tokens_per_s"] for r in train if "tokens_per_s" in r]
    return {
        "steps": newest.get("step", 0), "tokens": newest.get("tokens", 0),
        "elapsed": newest.get("elapsed", 0.0),
        "stop_reason": newest.get("stop_reason") if newest.get("kind") == "end" else None,
        "last_loss": last.get("loss"), "last_loss_step": last.get("step"),
        "first_loss": train[0].get("loss") if train else None,
        "median_tokens_per_s": sorted(tps)[len(tps) // 2] if tps else None,
        "last_eval": {k: v for k, v in (evals[-1] if evals else {}).items()
                      if k.startswith("eval_") or k == "step"},
        "diverged_at": diverged[-1]["step"] if diverged else None,
    }


_TEMPLATES = jinja2.Environment(autoescape=False, keep_trailing_newline=True, trim_blocks=True,
                                lstrip_blocks=True)
_TEMPLATES.filters.update(fmt=format, setting=lambda value: (
    ", ".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else str(value)))


@cache
def template(package: str, name: str) -> jinja2.Template:
    """The jinja2 template ``name`` shipped in ``package`` (``"lmlab.training"``,
    ``"lmlab.analysis"``), rendered verbatim: no HTML escaping (the callers escape what needs
    it), block tags leave no blank lines; filter ``fmt`` is :func:`format`. The one loader of
    the run and analysis reports' templates."""
    return _TEMPLATES.from_string(resources.files(package).joinpath(name).read_text("utf-8"))


def write_report(run_dir: Path) -> Path:
    """Write ``report.md`` (templates/run_report.md.j2: summary, last evaluation, loss curve,
    settings, cost) and ``loss.png`` of a run directory; returns the report's path."""
    run_dir = Path(run_dir)
    config_file = run_dir / "config.json"
    config = read_json(config_file) if config_file.is_file() else {}
    plot = plot_losses(read_metrics(run_dir / "metrics.jsonl"), run_dir / "loss.png")
    cost = run_dir / "cost.md"
    text = template("lmlab.training", "templates/run_report.md.j2").render(
        name=run_dir.name, summary=run_summary(run_dir), config=config, plot=plot,
        cost=cost.read_text(encoding="utf-8").strip() if cost.is_file() else None)
    path = run_dir / "report.md"
    atomic_write_text(path, text)
    return path
