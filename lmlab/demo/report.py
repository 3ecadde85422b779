"""The demo's report: markdown and a self-contained HTML page, from the run's own numbers."""

from __future__ import annotations

import base64
import html
import json
import statistics
from pathlib import Path
from typing import Any

from lmlab.utils.host import describe_host
from lmlab.utils.io import atomic_write_text

VERDICT_RULE = ("\"pretraining helped\" when the median gain of the pretrained model over the "
                "randomly initialised one exceeds the larger of their two spreads (max - min "
                "over seeds); \"hurt\" in the mirror case; otherwise \"no clear difference\".")


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


def _cell(entry) -> str:
    if entry is None:
        return "-"
    median, spread, values = entry
    if len(values) == 1:
        return f"{median:.3f} (one seed)"
    return f"{median:.3f} ± {spread / 2:.3f} (spread {spread:.3f})"


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


def pretraining_lines(final: dict[str, float] | None, unigram: dict[str, float],
                      at15: dict[str, float] | None = None) -> list[str]:
    """The unigram baseline, and the final validation loss and accuracy against the goal:
    judged on ``at15`` (the model scored at BERT's 15% masking) when given, else on ``final``
    (the run's own last evaluation, at its training masking rate)."""
    from lmlab.demo.job import GOAL_ACCURACY, GOAL_NATS_BELOW_UNIGRAM

    lines = [f"Unigram baseline of the train shards (a model that ignores context): entropy "
             f"{unigram['entropy']:.2f} nats (the dashed line in the plot); always guessing the "
             f"most frequent piece is {unigram['majority_accuracy']:.1%} accurate."]
    if final is None:
        return lines
    if at15 is not None:
        lines += ["", f"At its training masking rate the last validation MLM loss was "
                  f"{final['loss']:.2f} nats, accuracy {final['accuracy']:.1%}. Scored at BERT's "
                  "15% masking (comparable with other runs and with the goal):"]
        final = {**at15, "tokens": final["tokens"]}
    below = unigram["entropy"] - final["loss"]
    met_loss = below >= GOAL_NATS_BELOW_UNIGRAM
    met_acc = final["accuracy"] >= GOAL_ACCURACY
    side = "below" if below >= 0 else "above"
    lines += ["", f"Final validation MLM loss {final['loss']:.2f} nats, {abs(below):.2f} {side} "
              f"the unigram entropy (goal: at least {GOAL_NATS_BELOW_UNIGRAM}: "
              f"{'met' if met_loss else 'not met'}); accuracy {final['accuracy']:.1%} (goal: "
              f"{GOAL_ACCURACY:.0%}: {'met' if met_acc else 'not met'}), after "
              f"{final['tokens']:,} tokens."]
    return lines


def plan_sentence(summary: dict[str, Any]) -> str:
    """How the budget was shared on this host, and whether the run kept to it."""
    plan, budget = summary["plan"], summary["settings"]["budget"]
    recorded = plan["recorded_seconds"]
    said = (f"The budget was {budget / 60:.1f} min. The stages that need no pretrained model "
            f"took {plan['spent_before_pretraining'] / 60:.1f} min on this host; the pretrained "
            f"model's fine-tuning was expected to take as long as the random-init runs' "
            f"{plan['expected_finetuning'] / 60:.1f} min; pretraining got what was left "
            f"({plan['pretrain_seconds'] / 60:.1f} min, set by {plan['limited_by']}). The "
            f"stages took {recorded / 60:.1f} min when they ran")
    if recorded > budget * 1.1:
        return said + (f": **over the budget** (this host is too slow for "
                       f"{summary['settings']['finetune_tokens']:,} fine-tuning tokens per run "
                       "in it; give a larger --budget).")
    return said + "."


def _cost_markdown(run: Path) -> str:
    cost = run / "cost.md"
    return cost.read_text() if cost.exists() else "_No cost report was written for this run._"


def build_markdown(summary: dict[str, Any], plot: Path | None,
                   final: dict[str, float] | None = None) -> str:
    """The report's markdown from the summary, the loss plot and the final evaluation."""
    from lmlab.demo.job import model_name

    s = summary["settings"]
    plan = summary["plan"]
    rows = results_table(summary["results"])
    ceiling = (Path(s["ceiling"]).name if s.get("ceiling") and any("ceiling" in row
                                                                  for row in rows) else None)
    lines = [
        "# lmlab demo report",
        "",
        "Does pretraining a Transformer on unlabelled text make it better at downstream tasks? "
        f"This run pretrained a {model_name(s['family'], s['size'])} "
        f"({s['objective']}) on "
        f"{summary['corpus']['words']:,} words ({summary['shards']['train']['tokens']:,} tokens) "
        f"for {plan['pretrain_seconds'] / 60:.1f} minutes, then fine-tuned it and the same "
        f"architecture with random weights ("
        + ", ".join(f"{n} epoch{'s' if n > 1 else ''} of {task}"
                    for task, n in plan["finetune_epochs"].items())
        + f", about {s['finetune_tokens']:,} training tokens a run), and ran a "
        f"TF-IDF baseline, on {', '.join(s['tasks'])} with seeds {s['seeds']}"
        + (f"; the ceiling is {ceiling} (pretrained far longer on far more text): a head "
           f"trained on its frozen features (seed {s['seeds'][0]})." if ceiling else "."),
        "",
        plan_sentence(summary),
        "",
        "## Results (test split)",
        "",
        "| task | metric | pretrained | random init | TF-IDF |"
        + (f" {ceiling} (ceiling) |" if ceiling else "") + " verdict |",
        "|---|---|---|---|---|" + ("---|" if ceiling else "") + "---|",
    ]
    for row in rows:
        lines.append(f"| {row['task']} | {row['metric']} | {_cell(row['pretrained'])} | "
                     f"{_cell(row['random'])} | {_cell(row['tfidf'])} | "
                     + (f"{_cell(row.get('ceiling'))} | " if ceiling else "")
                     + f"**{row['verdict']}** (gain {row['gain']:+.3f}, threshold "
                     f"{row['threshold']:.3f}) |")
    lines += ["", tfidf_sentence(rows), "",
              f"Values: median over seeds ± half the spread. Verdict rule: {VERDICT_RULE}",
              "", "Per-seed values:", ""]
    for row in rows:
        for kind in ("pretrained", "random", "tfidf", "ceiling"):
            if kind in row:
                lines.append(f"- {row['task']} / {kind}: "
                             + ", ".join(f"{v:.4f}" for v in row[kind][2]))
    lines += ["", "## Pretraining", "",
              f"Recipe: {model_name(s['family'], s['size'])}, lr {s['pretrain_lr']:g}, "
              f"{s['pretrain_schedule']} schedule with "
              f"{s['pretrain_warmup']:.0%} warmup, batch {s['batch_size']} x {s['seq_len']} "
              f"tokens, mask rate {s['mask_prob']:.0%}, {s['precision']}, model changes "
              f"{json.dumps(s['model_args'])}: the winner of the ablation in docs/demo.md.", ""]
    if plot:
        lines += [f"![pretraining loss]({plot.name})", ""]
    if summary.get("unigram"):
        lines += pretraining_lines(final, summary["unigram"],
                                   summary["analysis"].get("mlm_at_15")) + [""]
    lines += [f"Run directory: `{summary['pretrain_run']}` (its `report.md` has the details).",
              "", "### Cost", "", _cost_markdown(Path(summary["pretrain_run"])), ""]
    lines += ["## Words in context", "",
              "Each query's word is compared with the same word in corpus sentences. "
              "*Contextual* uses the last layer; *layer 0* is the embedding layer, where a "
              "word's vector barely depends on its sentence.", ""]
    for entry in summary["analysis"]["neighbours"]:
        if "error" in entry:
            lines += [f"**{entry['word']}**: {entry['error']}", ""]
            continue
        sims = entry["query_similarity"]
        lines += [f"### {entry['word']} ({entry['occurrences']} corpus occurrences)", "",
                  f"Cosine similarity of the word's vectors in the two queries: contextual "
                  f"{sims['contextual']:.3f}, layer 0 {sims['layer0']:.3f}.", "",
                  "Static (input-embedding) neighbours, the same for every sense: "
                  + ", ".join(f"{w} ({v:.2f})" for w, v in entry["static_vocabulary_neighbours"]),
                  ""]
        for query in entry["queries"]:
            lines.append(f"**{query['query']}**")
            lines.append("")
            for name in ("contextual", "layer0"):
                for hit in query[name]:
                    lines.append(f"- {name}: {hit['score']:.3f} {hit['sentence']}")
            lines.append("")
    lines += ["## Fill-mask", ""]
    for row in summary["analysis"]["fill_mask"]:
        lines.append(f"- {row['text']} → " + ", ".join(
            f"{g['token']} ({g['score']:.2f})" for g in row["guesses"]))
    lines += ["", "## Stages", "", "| stage | cached | seconds | folder |", "|---|---|---|---|"]
    for stage in summary["stages"]:
        lines.append(f"| {stage['stage']} | {'yes' if stage['cached'] else 'no'} | "
                     f"{stage['seconds']} | `{stage['folder']}` |")
    lines += ["", f"Total wall time of this invocation: {summary['total_seconds'] / 60:.1f} min "
              f"on {summary.get('host') or describe_host()} (stages marked cached ran earlier, "
              "possibly elsewhere).",
              "", "## Settings", "", "```json", json.dumps(s, indent=2), "```", ""]
    return "\n".join(lines)


def markdown_to_html(markdown: str, out: Path) -> str:
    """A small converter for the report's own markdown (headings, tables, lists, images)."""
    body: list[str] = []
    in_table = in_list = in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            body.append("</pre>" if in_code else "<pre>")
            in_code = not in_code
            continue
        if in_code:
            body.append(html.escape(line))
            continue
        if in_list and not line.startswith("- "):
            body.append("</ul>")
            in_list = False
        if in_table and not line.startswith("|"):
            body.append("</table>")
            in_table = False
        text = html.escape(line)
        text = _inline(text)
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            body.append(f"<h{level}>{_inline(html.escape(line[level:].strip()))}</h{level}>")
        elif line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if all(set(c) <= set("-: ") for c in cells):
                continue
            tag = "th" if not in_table else "td"
            if not in_table:
                body.append("<table>")
                in_table = True
            body.append("<tr>" + "".join(f"<{tag}>{_inline(html.escape(c))}</{tag}>"
                                         for c in cells) + "</tr>")
        elif line.startswith("- "):
            if not in_list:
                body.append("<ul>")
                in_list = True
            body.append(f"<li>{_inline(html.escape(line[2:]))}</li>")
        elif line.startswith("![") and "](" in line:
            name = line.split("](", 1)[1].rstrip(")")
            image = out / name
            if image.exists():
                data = base64.b64encode(image.read_bytes()).decode()
                body.append(f'<img alt="{html.escape(name)}" src="data:image/png;base64,{data}">')
        elif line.strip():
            body.append(f"<p>{text}</p>")
    if in_table:
        body.append("</table>")
    if in_list:
        body.append("</ul>")
    style = ("body{font-family:sans-serif;max-width:1000px;margin:2em auto;line-height:1.4}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px}"
             "pre{background:#f4f4f4;padding:8px}img{max-width:100%}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>lmlab demo report</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")


def _inline(text: str) -> str:
    import re

    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    text = re.sub(r"`(.+?)`", r"<code>\1</code>", text)
    return re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"<i>\1</i>", text)


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
    """The short summary ``lmlab demo`` prints at the end."""
    print("\nlmlab demo: results on the test split (median over seeds, spread in brackets)")
    rows = results_table(summary["results"])
    ceiling = any("ceiling" in row for row in rows)
    print(f"{'task':<22}{'pretrained':>20}{'random init':>20}{'TF-IDF':>20}"
          + (f"{'ceiling':>20}" if ceiling else "") + "  verdict")
    for row in rows:
        kinds = ("pretrained", "random", "tfidf") + (("ceiling",) if ceiling else ())
        cells = "".join(f"{row[k][0]:>12.3f} ({row[k][1]:.3f})" if k in row else f"{'-':>20}"
                        for k in kinds)
        print(f"{row['task']:<22}{cells}  {row['verdict']}")
    print(tfidf_sentence(rows).replace("**", ""))
    print(f"host: {summary.get('host') or describe_host()}")
    print(f"report: {report} (and {report.with_suffix('.html')})")
