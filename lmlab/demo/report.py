"""The demo's report: markdown and a self-contained HTML page, from the run's own numbers."""

from __future__ import annotations

import base64
import json
import statistics
from pathlib import Path
from typing import Any

import jinja2
from markdown_it import MarkdownIt
from markupsafe import Markup

from lmlab.utils.host import describe_host
from lmlab.utils.io import atomic_write_text

# the goal of the demo's pretraining (issue #13): this far below the unigram entropy, this accurate
GOAL_NATS_BELOW_UNIGRAM = 1.5
GOAL_ACCURACY = 0.25
VERDICT_RULE = ("\"pretraining helped\" when the median gain of the pretrained model over the "
                "randomly initialised one exceeds the larger of their two spreads (max - min "
                "over seeds); \"hurt\" in the mirror case; otherwise \"no clear difference\".")


def model_name(family: str, size: str) -> str:
    """How the demo names its model: ``RoFormer-mini``."""
    from lmlab.models.families import KNOWN_FAMILIES, get_family

    name = get_family(family).display_name if family in KNOWN_FAMILIES else family
    return f"{name}-{size}"


def epochs_text(epochs: dict[str, int]) -> str:
    """``1 epoch of fortunes-topic, 3 epochs of wordnet-supersense``."""
    return ", ".join(f"{n} epoch{'s' if n > 1 else ''} of {name}" for name, n in epochs.items())


def metric_values(runs: list[dict], split: str, metric: str) -> list[float]:
    return [float(r[split][metric]) for r in runs if r.get(split) and metric in r[split]]


def median_spread(values: list[float]) -> tuple[float, float]:
    return statistics.median(values), max(values) - min(values)


def verdict(pretrained: list[float], random: list[float]) -> tuple[str, float, float]:
    """Apply :data:`VERDICT_RULE`; returns (verdict, gain, threshold)."""
    pre_median, pre_spread = median_spread(pretrained)
    rnd_median, rnd_spread = median_spread(random)
    gain, threshold = pre_median - rnd_median, max(pre_spread, rnd_spread)
    if gain > threshold:
        return "pretraining helped", gain, threshold
    if gain < -threshold:
        return "pretraining hurt", gain, threshold
    return "no clear difference", gain, threshold


def results_table(results: dict[str, dict[str, list[dict]]], split: str = "test") -> list[dict]:
    """One row per task: each kind's (median, spread, values) of the task's first metric, the
    verdict of pretrained against random init; ``ceiling`` only when that kind ran."""
    rows = []
    for task, kinds in results.items():
        metric = next(iter(kinds["pretrained"][0][split]))  # the task's first metric
        row: dict[str, Any] = {"task": task, "metric": metric}
        for kind in ("pretrained", "random", "tfidf", "ceiling"):
            values = metric_values(kinds.get(kind, []), split, metric)
            if values:
                row[kind] = median_spread(values) + (values,)
        row["verdict"], row["gain"], row["threshold"] = verdict(
            metric_values(kinds["pretrained"], split, metric),
            metric_values(kinds["random"], split, metric))
        rows.append(row)
    return rows


def tfidf_sentence(rows: list[dict]) -> str:
    """Whether the pretrained model's median beat TF-IDF's on any task, said plainly."""
    beaten = [f"{r['task']} ({r['pretrained'][0]:.3f} vs {r['tfidf'][0]:.3f})" for r in rows
              if r["pretrained"][0] > r["tfidf"][0]]
    if beaten:
        return "The pretrained model **did** beat TF-IDF on " + ", ".join(beaten) + "."
    gaps = ", ".join(f"{r['task']} {r['pretrained'][0]:.3f} vs {r['tfidf'][0]:.3f}" for r in rows)
    return f"The pretrained model **did not** beat TF-IDF on any task ({gaps})."


def final_evaluation(records: list[dict[str, Any]]) -> dict[str, float] | None:
    """The last validation MLM loss and accuracy of a pretraining run's metrics (None when it
    has no masked-LM evaluation)."""
    evals = [r for r in records if r.get("kind") == "eval" and "eval_mlm_loss" in r]
    if not evals:
        return None
    return {"loss": float(evals[-1]["eval_mlm_loss"]),
            "accuracy": float(evals[-1].get("eval_mlm_accuracy", float("nan"))),
            "tokens": int(evals[-1].get("tokens", 0))}


def pretraining_text(final: dict[str, float] | None, unigram: dict[str, float],
                     at15: dict[str, float] | None = None) -> str:
    """The unigram baseline, and the final validation loss and accuracy against the goal
    (templates/pretraining.md.j2): judged on ``at15`` (the model scored at BERT's 15% masking)
    when given, else on ``final`` (the run's own last evaluation, at its training masking rate)."""
    return _TEMPLATES.get_template("pretraining.md.j2").render(
        final=final, unigram=unigram, at15=at15, goal_nats=GOAL_NATS_BELOW_UNIGRAM,
        goal_accuracy=GOAL_ACCURACY).rstrip("\n")


def _cost_markdown(run: Path) -> str:
    cost = run / "cost.md"
    return cost.read_text() if cost.exists() else "_No cost report was written for this run._"


def _cell(entry) -> str:
    if entry is None:
        return "-"
    median, spread, values = entry
    if len(values) == 1:
        return f"{median:.3f} (one seed)"
    return f"{median:.3f} ± {spread / 2:.3f} (spread {spread:.3f})"


def _scored(items: list) -> str:
    """``word (0.12), ...`` from (word, score) pairs or fill-mask guesses."""
    pairs = [(g["token"], g["score"]) if isinstance(g, dict) else g for g in items]
    return ", ".join(f"{word} ({score:.2f})" for word, score in pairs)


_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("lmlab.demo", "templates"), undefined=jinja2.StrictUndefined,
    autoescape=jinja2.select_autoescape(["html.j2"]), trim_blocks=True, lstrip_blocks=True,
    keep_trailing_newline=True)
_TEMPLATES.filters.update(fmt=format, cell=_cell, scored=_scored,
                          dumps=json.dumps, epochs=epochs_text)


def build_markdown(summary: dict[str, Any], plot: Path | None,
                   final: dict[str, float] | None = None) -> str:
    """The report's markdown (templates/report.md.j2) from the summary, the loss plot and the
    final evaluation."""
    s = summary["settings"]
    rows = results_table(summary["results"])
    ceiling = (Path(s["ceiling"]).name if s.get("ceiling") and any("ceiling" in row
                                                                  for row in rows) else None)
    pretraining = (pretraining_text(final, summary["unigram"],
                                    summary["analysis"].get("mlm_at_15"))
                   if summary.get("unigram") else None)
    return _TEMPLATES.get_template("report.md.j2").render(
        summary=summary, s=s, plan=summary["plan"], rows=rows, ceiling=ceiling,
        model=model_name(s["family"], s["size"]),
        tfidf_sentence=tfidf_sentence(rows), verdict_rule=VERDICT_RULE,
        plot=plot.name if plot else None, pretraining=pretraining,
        cost=_cost_markdown(Path(summary["pretrain_run"])), analysis=summary["analysis"],
        host=summary.get("host") or describe_host(), settings_json=json.dumps(s, indent=2))


def markdown_to_html(markdown: str, out: Path) -> str:
    """The self-contained HTML page (templates/report.html.j2) of the report's markdown: CommonMark
    with tables (markdown-it-py), raw HTML escaped, images inlined from ``out``."""
    parser = MarkdownIt("commonmark", {"html": False}).enable("table")
    render_image = parser.renderer.rules["image"]

    def inline_image(renderer, tokens, idx, options, env) -> str:
        image = out / tokens[idx].attrGet("src")
        if image.is_file():
            data = base64.b64encode(image.read_bytes()).decode()
            tokens[idx].attrSet("src", f"data:image/png;base64,{data}")
        return render_image(tokens, idx, options, env)

    parser.add_render_rule("image", inline_image)
    return _TEMPLATES.get_template("report.html.j2").render(body=Markup(parser.render(markdown)))


def write_report(out: Path, summary: dict[str, Any]) -> Path:
    from lmlab.training.metrics_log import read_metrics
    from lmlab.training.report import plot_losses

    metrics = read_metrics(Path(summary["pretrain_run"]) / "metrics.jsonl")
    entropy = (summary.get("unigram") or {}).get("entropy")
    plot = plot_losses(metrics, out / "pretraining-loss.png", minutes=True,
                       level=None if entropy is None else
                       (entropy, f"unigram entropy ({entropy:.2f} nats)"))
    markdown = build_markdown(summary, plot, final_evaluation(metrics))
    atomic_write_text(out / "report.md", markdown)
    atomic_write_text(out / "report.html", markdown_to_html(markdown, out))
    return out / "report.md"


def print_summary(summary: dict[str, Any], report: Path) -> None:
    """The short summary ``lmlab demo`` prints at the end (templates/summary.txt.j2)."""
    rows = results_table(summary["results"])
    ceiling = any("ceiling" in row for row in rows)
    print(_TEMPLATES.get_template("summary.txt.j2").render(
        rows=rows, ceiling=ceiling, tfidf_sentence=tfidf_sentence(rows), report=report,
        kinds=("pretrained", "random", "tfidf") + (("ceiling",) if ceiling else ()),
        host=summary.get("host") or describe_host()), end="")
