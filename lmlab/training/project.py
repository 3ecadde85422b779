"""What a whole project cost (``lmlab cost project DIR``): every run folder under ``DIR``
(sweeps, seeds, failed and resumed runs, each counted once with all its sessions) summed into
FLOPs, time, energy, CO2 and money, beside the one final run: Strubell et al. (2019)'s "with
tuning" view, as a table and a plot (docs/cost.md, "What a project cost")."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lmlab.cost.report import SESSIONS_FILE, STARTED_OVER, co2_kg
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import iter_jsonl, read_json

QUANTITIES = ("flops", "seconds", "energy_kwh", "co2_kg", "money")  # what the totals sum
_LABELS = dict(zip(QUANTITIES, ("FLOPs", "time", "energy", "CO2", "money")))


@dataclass
class RunCost:
    """One run's cost over all its sessions. ``status``: finished, failed (its last session
    raised), interrupted (its last record is from a checkpoint: killed, or still running), or
    untracked (a run folder without cost records, e.g. ``--no-cost``: counted as zero)."""

    run: str
    status: str
    sessions: int = 0
    tokens: int = 0
    flops: float = 0.0
    seconds: float = 0.0
    energy_kwh: float | None = 0.0
    co2_kg: float | None = 0.0
    money: float | None = None
    ended: str = ""


@dataclass
class ProjectCost:
    """The runs of a folder, their total and the final run (None: no run)."""

    folder: str
    runs: list[RunCost]
    final: RunCost | None
    notes: list[str] = field(default_factory=list)

    def total(self) -> dict[str, float | None]:
        """Each quantity summed over the runs (None where no run has it)."""
        out: dict[str, float | None] = {"tokens": float(sum(r.tokens for r in self.runs))}
        for key in QUANTITIES:
            values = [getattr(r, key) for r in self.runs if getattr(r, key) is not None]
            out[key] = sum(values) if values else None
        return out

    def tuning_factor(self, key: str = "flops") -> float | None:
        """The project's ``key`` over the final run's: what tuning multiplied it by."""
        total, final = self.total()[key], getattr(self.final, key, None)
        return None if not final or total is None else total / final

    def to_dict(self) -> dict[str, Any]:
        return {"folder": self.folder, "runs": [asdict(r) for r in self.runs],
                "total": self.total(), "final": None if self.final is None else self.final.run,
                "with_tuning": {k: self.tuning_factor(k) for k in QUANTITIES}, "notes": self.notes}

    def to_markdown(self) -> str:
        """A row per run, the total and the final run, then the "with tuning" factors."""
        def cells(name: str, status: str, sessions: Any, row: dict[str, Any]) -> str:
            def fmt(key: str, text: str) -> str:
                return "n/a" if row.get(key) is None else text.format(row[key])

            return (f"| {name} | {status} | {sessions} | {int(row['tokens']):,} | "
                    f"{row['flops'] or 0.0:.4g} | {row['seconds'] or 0.0:,.1f} | "
                    f"{fmt('energy_kwh', '{:.6f}')} | {fmt('co2_kg', '{:.6f}')} | "
                    f"{fmt('money', '{:,.4f}')} |")

        lines = ["| run | status | sessions | tokens | FLOPs | time (s) | energy (kWh) | "
                 "CO2 (kg) | money |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [cells(r.run, r.status, r.sessions, asdict(r)) for r in self.runs]
        lines.append(cells(f"**all {len(self.runs)} runs**", "", sum(r.sessions for r in self.runs),
                           self.total()))
        if self.final is not None:
            lines.append(cells(f"final run: {self.final.run}", self.final.status,
                               self.final.sessions, asdict(self.final)))
            factors = ", ".join(f"{_LABELS[key]} x{value:,.2f}" for key in QUANTITIES
                                if (value := self.tuning_factor(key)) is not None)
            lines += ["", f"With tuning (Strubell et al. 2019): the project cost {factors} its "
                          "final run."]
        lines += [f"- {note}" for note in self.notes]
        return "\n".join(lines)

    def plot(self, path: str | Path) -> Path:
        """Each run's FLOPs (the final run marked), and the project against its final run for
        each quantity, as a PNG."""
        from lmlab.training.report import pyplot, save_png

        plt = pyplot()
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, max(3.5, 0.3 * len(self.runs) + 1)))
        colours = {"finished": "tab:blue", "failed": "tab:red", "interrupted": "tab:orange",
                   "untracked": "tab:grey"}
        names = [r.run + (" (final)" if r is self.final else "") for r in self.runs]
        left.barh(names, [r.flops for r in self.runs],
                  color=[colours[r.status] for r in self.runs],
                  edgecolor=["black" if r is self.final else "none" for r in self.runs])
        left.invert_yaxis()
        left.set_xlabel("training FLOPs")
        left.set_title(f"{len(self.runs)} runs under {Path(self.folder).name} (blue finished, "
                       "red failed, orange interrupted)", fontsize=9)
        keys = [k for k in QUANTITIES if self.tuning_factor(k) is not None]
        factors = [self.tuning_factor(k) for k in keys]
        right.bar([_LABELS[k] for k in keys], factors, color="tab:purple")
        right.axhline(1.0, color="black", lw=1, ls="--", label="the final run")
        for x, value in enumerate(factors):
            right.text(x, value, f"x{value:,.1f}", ha="center", va="bottom")
        right.set_ylabel("all runs / final run")
        right.set_title("with tuning (Strubell et al. 2019)")
        right.legend()
        fig.tight_layout()
        return save_png(fig, path)


def _sessions(run_dir: Path, file: str = SESSIONS_FILE) -> list[dict[str, Any]]:
    """A run's cost records: the newest of each session in ``file`` (``cost-sessions.jsonl``,
    or a run's that was started over), or its ``cost.json`` alone (runs of an older lmlab kept
    only their last session's)."""
    path = run_dir / file
    if path.is_file():
        newest: dict[str, dict[str, Any]] = {}
        for _, record in iter_jsonl(path):
            newest[record["session"]] = record
        return list(newest.values())
    if file == SESSIONS_FILE and (run_dir / "cost.json").is_file():
        stamp = datetime.fromtimestamp((run_dir / "cost.json").stat().st_mtime, UTC)
        return [{**read_json(run_dir / "cost.json"), "status": "finished",
                 "time": stamp.isoformat(timespec="milliseconds")}]
    return []


def run_cost(run_dir: Path, name: str, price_per_hour: float | None = None,
             grid_g_per_kwh: float | None = None, file: str = SESSIONS_FILE) -> RunCost:
    """The cost of one run folder over its sessions (in ``file``: see :func:`_sessions`);
    ``price_per_hour`` and ``grid_g_per_kwh`` price every session alike (default: what each
    session recorded)."""
    records = sorted(_sessions(run_dir, file), key=lambda r: r.get("time", ""))
    if not records:
        return RunCost(name, "untracked", energy_kwh=None, co2_kg=None)
    cost = RunCost(name, {"running": "interrupted"}.get(records[-1]["status"],
                                                        records[-1]["status"]),
                   sessions=len(records), ended=records[-1].get("time", ""))
    for record in records:
        cost.tokens += int(record["tokens"])
        cost.flops += float(record.get("total_flops", record["flops"]))
        cost.seconds += float(record["wall_seconds"])
        joules = record.get("energy_joules")
        cost.energy_kwh = None if joules is None or cost.energy_kwh is None else \
            cost.energy_kwh + joules / 3.6e6
        grid = record["grid_g_per_kwh"] if grid_g_per_kwh is None else grid_g_per_kwh
        co2 = None if joules is None else co2_kg(joules, grid, record.get("pue", 1.0))
        cost.co2_kg = None if co2 is None or cost.co2_kg is None else cost.co2_kg + co2
        price = record.get("price_per_device_hour") if price_per_hour is None else price_per_hour
        if price is not None:
            money = record["wall_seconds"] / 3600.0 * record["devices"] * price
            cost.money = (cost.money or 0.0) + money
    return cost


def started_over(run_dir: Path) -> list[Path]:
    """The cost records of the runs ``--overwrite`` started over in ``run_dir``, oldest first
    (:func:`~lmlab.training.run_dir.remove_run` keeps them apart from the new run's)."""
    return sorted(run_dir.glob(STARTED_OVER.format("*")),
                  key=lambda p: int(p.name.split(".")[1].rsplit("-", 1)[-1]))


def find_runs(folder: Path) -> list[Path]:
    """The run folders under ``folder`` (itself included): those holding cost records, or
    the config.json and metrics.jsonl every Trainer run writes."""
    found = {p.parent for name in (SESSIONS_FILE, "cost.json", "metrics.jsonl")
             for p in folder.rglob(name)}
    return sorted(p for p in found if (p / SESSIONS_FILE).is_file() or (p / "cost.json").is_file()
                  or (p / "config.json").is_file())


def project_cost(folder: str | Path, final: str | Path | None = None,
                 price_per_hour: float | None = None,
                 grid_g_per_kwh: float | None = None) -> ProjectCost:
    """The cost of every run under ``folder`` and of the ``final`` one (a run folder; default:
    the finished run whose last session ended last)."""
    from lmlab.cost.report import cost_settings
    from lmlab.utils.checks import check_folder

    check_folder(folder, "DIR", "give the folder that holds your runs")
    cost_settings({"price_per_hour": price_per_hour, "grid_g_per_kwh": grid_g_per_kwh})
    folder = Path(folder)
    paths = find_runs(folder)
    if not paths:
        raise LmlabError(f"{folder} holds no run folder (none has cost-sessions.jsonl, cost.json "
                         "or metrics.jsonl)", "point at the folder your `lmlab pretrain`/"
                         "`lmlab finetune` runs wrote into")
    names = [str(p.relative_to(folder)) if p != folder else "." for p in paths]
    runs = [run_cost(p, n, price_per_hour, grid_g_per_kwh) for p, n in zip(paths, names)]
    for path, name in zip(paths, names):  # runs started over in the same folder (--overwrite)
        for number, old in enumerate(started_over(path), 1):
            runs.append(run_cost(path, f"{name} (started over, {number})", price_per_hour,
                                 grid_g_per_kwh, old.name))
    if final is None:
        done = [r for r in runs if r.status == "finished"] or runs
        chosen = max(done, key=lambda r: r.ended)
    else:
        target = Path(final).resolve()
        matches = [r for r, p in zip(runs, paths) if p.resolve() == target
                   or (folder / str(final)).resolve() == p.resolve()]
        if not matches:
            raise LmlabError(f"--final {final} is not one of the runs under {folder}",
                             f"name one of: {', '.join(names)}")
        chosen = matches[0]
    notes = []
    untracked = [r.run for r in runs if r.status == "untracked"]
    if untracked:
        notes.append(f"no cost records (trained with --no-cost, or not a Trainer run), counted "
                     f"as zero: {', '.join(untracked)}")
    if any(r.money is None for r in runs if r.status != "untracked"):
        notes.append("money: runs without a price per device-hour are not priced "
                     "(pass --price-per-hour to price them all)")
    return ProjectCost(str(folder), runs, chosen, notes)


def write_project_report(project: ProjectCost, out: str | Path) -> Path:
    """``out``: the plot (PNG) beside a ``.md`` table and a ``.json`` of the same name."""
    from lmlab.utils.io import atomic_write_json, atomic_write_text

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    project.plot(out.with_suffix(".png"))
    atomic_write_text(out.with_suffix(".md"), project.to_markdown() + "\n")
    atomic_write_json(out.with_suffix(".json"), json.loads(json.dumps(project.to_dict())))
    return out.with_suffix(".png")
