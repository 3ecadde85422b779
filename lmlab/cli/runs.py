"""``lmlab runs show runs/NAME``: a run's report (summary, last evaluation, cost, host)."""

from __future__ import annotations

import argparse
from pathlib import Path

from lmlab.utils.errors import LmlabError


def register(commands) -> None:
    p = commands.command("show", help="print a run's report: summary, last evaluation, cost",
                         example="lmlab runs show runs/mini", handler=_show, group="runs")
    p.add_argument("run_dir", help="a run directory written by `lmlab pretrain`")


def summary_text(run_dir: Path) -> str:
    """A short text report of a run that has not written report.md yet (still training)."""
    from lmlab.training.report import run_summary
    from lmlab.utils.io import read_json

    summary = run_summary(run_dir)
    lines = [f"run {run_dir} (in progress or interrupted: no report.md yet)",
             f"  steps {summary['steps']:,}, tokens {summary['tokens']:,}, "
             f"{summary['elapsed']:.1f} s"
             + (f", stopped by {summary['stop_reason']}" if summary["stop_reason"] else "")]
    if summary["last_loss"] is not None:
        lines.append(f"  loss {summary['first_loss']:.4f} -> {summary['last_loss']:.4f} "
                     f"(step {summary['last_loss_step']:,}, the last logged)")
    if summary["median_tokens_per_s"]:
        lines.append(f"  {summary['median_tokens_per_s']:,.0f} tokens/s (median)")
    if summary["last_eval"]:
        lines.append("  last eval: " + ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in summary["last_eval"].items()))
    if summary["diverged_at"] is not None:
        lines.append(f"  DIVERGED at step {summary['diverged_at']}")
    config_file = run_dir / "config.json"
    config = read_json(config_file) if config_file.is_file() else {}
    hparams = config.get("hparams", {})
    keys = ("family", "size", "objective", "lr", "batch_size", "seq_len")
    if any(k in hparams for k in keys):
        lines.append("  " + ", ".join(f"{k}={hparams[k]}" for k in keys if k in hparams))
    lines.append(f"  host: {config.get('host', 'not recorded')}")
    return "\n".join(lines)


def _show(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    report = run_dir / "report.md"
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file() and not report.is_file():
        raise LmlabError(f"{run_dir} is not a run directory (no metrics.jsonl or report.md)",
                         "give a folder written by `lmlab pretrain --out`")
    if report.is_file() and (not metrics.is_file()
                             or report.stat().st_mtime >= metrics.stat().st_mtime):
        print(report.read_text(encoding="utf-8"), end="")
    else:
        print(summary_text(run_dir))
    return 0
