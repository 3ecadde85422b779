"""The papers' published training costs (GPT-3's Table D.1, BERT, XLNet; ``facts.json``'s
``published_costs``) recomputed by :func:`~lmlab.cost.estimate.estimate_run` beside the
published numbers (``lmlab cost published``; docs/cost.md, "The papers' cost figures
recomputed")."""

from __future__ import annotations

from typing import Any

from lmlab.cost.estimate import estimate_run, implied_mfu
from lmlab.cost.facts import facts
from lmlab.cost.presets import preset_config
from lmlab.cost.report import money


def estimate_command(entry: dict[str, Any]) -> str:
    """The ``lmlab cost estimate`` command that recomputes a published entry."""
    parts = [f"lmlab cost estimate --model {entry['model']} --tokens {entry['tokens']:.6g}",
             f"--seq-len {entry['seq_len']}"]
    if entry.get("head"):
        parts.append(f"--head {entry['head']}")
    if entry.get("sparse_prediction"):
        parts.append(f"--sparse-prediction {entry['sparse_prediction']:.4f}")
    return " ".join(parts)


def recompute(entry: dict[str, Any]) -> dict[str, Any]:
    """One published entry beside lmlab's count: the estimate (attention in full), Kaplan's
    half-counted causal attention, 6·N·D with lmlab's parameter count, and, where the paper
    gives hardware and time, the MFU that implies and the money at the quoted price."""
    args = {"seq_len": entry["seq_len"], "head": entry.get("head"),
            "sparse_prediction_fraction": entry.get("sparse_prediction")}
    full = estimate_run(entry["model"], entry["tokens"], **args)
    half = estimate_run(entry["model"], entry["tokens"], causal_attention="half", **args)
    params = preset_config(entry["model"]).num_parameters()
    row = {"model": entry["model"], "label": entry["label"], "tokens": entry["tokens"],
           "params": params, "published_flops": entry.get("flops"),
           "published_pf_days": entry.get("pf_days"), "flops": full.total_flops,
           "pf_days": full.pf_days, "flops_causal_half": half.total_flops,
           "six_n_d": 6.0 * params * entry["tokens"], "source": entry["source"],
           "command": estimate_command(entry)}
    if entry.get("flops"):
        row["ratio"] = full.total_flops / entry["flops"]
    if entry.get("hours"):
        row["implied_mfu"] = implied_mfu(full.total_flops, entry["hours"], entry["devices"],
                                         entry["peak_flops_per_s"])
        row["money"] = money(entry["hours"] * 3600.0, entry["devices"],
                             entry["price_per_device_hour"])
        row["published_money"] = entry["money"]
    return row


def published_costs() -> list[dict[str, Any]]:
    """Every published entry recomputed (:func:`recompute`)."""
    return [recompute(entry) for entry in facts()["published_costs"]]


def published_markdown(rows: list[dict[str, Any]]) -> str:
    """The rows as a table (published against lmlab), then each row's notes and command."""
    def number(value: float | None, text: str = "{:.3g}") -> str:
        return "-" if value is None else text.format(value)

    lines = ["| model | params (lmlab) | tokens | published FLOPs | published PF-s-days | "
             "lmlab FLOPs | lmlab PF-s-days | lmlab / published | causal half | 6·N·D |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(
            f"| {row['label']} | {row['params'] / 1e6:,.0f}M | {row['tokens']:.3g} | "
            f"{number(row['published_flops'])} | {number(row['published_pf_days'], '{:,.3g}')} | "
            f"{row['flops']:.3g} | {row['pf_days']:,.3g} | {number(row.get('ratio'), '{:.3f}')} | "
            f"{row['flops_causal_half']:.3g} | {row['six_n_d']:.3g} |")
    lines.append("")
    for row in rows:
        note = f"- {row['label']}: `{row['command']}`; {row['source']}"
        if "implied_mfu" in row:
            note += (f". Implied MFU {100 * row['implied_mfu']:.1f}%; money recomputed "
                     f"${row['money']:,.0f} (quoted ${row['published_money']:,.0f})")
        lines.append(note + ".")
    return "\n".join(lines)
