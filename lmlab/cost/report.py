"""What a training run cost: FLOPs, MFU, time, energy, CO2 and money, in one report.

The trainer starts a :class:`CostTracker`, calls ``add_tokens`` once per optimiser step and
asks for ``report()``, a :class:`CostReport`. CO2 is ``kWh x PUE x grid intensity`` (default
:data:`DEFAULT_GRID_G_PER_KWH`, the 2023 world average; docs/cost.md, "CO2 and money"); money is
``hours x devices x price per device-hour``, with no default price. A run sets both with
``lmlab pretrain --price-per-hour P --grid-intensity G`` or a ``cost:`` section of its config
(:data:`COST_SETTINGS`, checked by :func:`cost_settings`).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lmlab.cost.energy import EnergyMeter
from lmlab.cost.facts import facts
from lmlab.cost.flops import counting_note, flops_per_token, seq2seq_step_flops
from lmlab.cost.peak import device_peak
from lmlab.utils.checks import check_choice
from lmlab.utils.errors import LmlabError
from lmlab.utils.host import describe_host
from lmlab.utils.io import atomic_write_json, atomic_write_text

DEFAULT_GRID_G_PER_KWH: float = facts()["grid_g_per_kwh"]["value"]  # world average, 2023 (Ember)
LB_PER_KG = 2.20462262
J_PER_KWH = 3.6e6
SESSIONS_FILE = "cost-sessions.jsonl"  # a run folder's cost, one record per session and update
STARTED_OVER = "cost-sessions.started-over-{}.jsonl"  # the records of a run started over


COST_SETTINGS = {  # key of a run's cost: section -> what it is
    "price_per_hour": "price per device-hour (your currency; no default: money is not priced)",
    "grid_g_per_kwh": f"grid carbon intensity in g CO2e/kWh (default {DEFAULT_GRID_G_PER_KWH:g})",
}


def cost_settings(values: dict[str, Any] | None) -> dict[str, float]:
    """A run's ``cost:`` settings checked before any work (known keys, numbers >= 0): the
    given ones as keyword arguments for :class:`CostTracker`."""
    checked: dict[str, float] = {}
    for key, value in (values or {}).items():
        if value is None:
            continue
        check_choice(key, COST_SETTINGS, "the cost: section", "cost setting")
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = float("nan")
        if not number >= 0 or number == float("inf"):
            raise LmlabError(f"cost setting {key} = {value!r} is not a number >= 0",
                             f"give the {COST_SETTINGS[key]}, e.g. 0.5")
        checked[key] = number
    return checked


def co2_kg(energy_joules: float, grid_g_per_kwh: float = DEFAULT_GRID_G_PER_KWH,
           pue: float = 1.0) -> float:
    """kg CO2e of ``energy_joules`` drawn by the devices, with a data-centre PUE applied."""
    if grid_g_per_kwh < 0 or pue < 1.0:
        raise LmlabError(f"grid intensity {grid_g_per_kwh} g/kWh or PUE {pue} out of range",
                         "use a non-negative intensity and a PUE of at least 1.0")
    return energy_joules / J_PER_KWH * pue * grid_g_per_kwh / 1000.0


def money(seconds: float, devices: int, price_per_device_hour: float) -> float:
    """Cost of renting ``devices`` for ``seconds`` at ``price_per_device_hour``."""
    if price_per_device_hour < 0:
        raise LmlabError(f"negative price {price_per_device_hour}", "pass a price >= 0")
    return seconds / 3600.0 * devices * price_per_device_hour


def _si(value: float, unit: str) -> str:
    for factor, prefix in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"),
                           (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:,.2f} {prefix}{unit}"
    return f"{value:,.2f} {unit}"


@dataclass
class CostReport:
    """The cost of one run. FLOPs are model FLOPs (see :mod:`lmlab.cost.flops`)."""

    model: str
    parameters: int
    tokens: int
    flops: float
    flops_per_token: float
    wall_seconds: float
    device: str
    devices: int
    precision: str
    achieved_flops_per_s: float
    peak_flops_per_s: float | None
    peak_label: str
    mfu: float | None
    energy_joules: float | None
    energy_method: str
    grid_g_per_kwh: float
    pue: float
    co2_kg: float | None
    price_per_device_hour: float | None
    money: float | None
    notes: list[str] = field(default_factory=list)
    host: str = ""  # lmlab.utils.host.describe_host() of the machine that ran
    # FLOPs spent beside the trained model, by label (a distillation teacher's forward passes):
    # not in ``flops``, ``achieved_flops_per_s`` or ``mfu``, which count the trained model's
    side_flops: dict[str, float] = field(default_factory=dict)

    @property
    def total_flops(self) -> float:
        """The trained model's FLOPs and the side FLOPs together."""
        return self.flops + sum(self.side_flops.values())

    @property
    def energy_kwh(self) -> float | None:
        return None if self.energy_joules is None else self.energy_joules / J_PER_KWH

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "energy_kwh": self.energy_kwh, "total_flops": self.total_flops}

    def _rows(self) -> list[tuple[str, str]]:
        mfu = "n/a (no peak)" if self.mfu is None else f"{100 * self.mfu:.1f}%"
        energy = ("n/a" if self.energy_joules is None
                  else f"{self.energy_joules / 1000:,.1f} kJ ({self.energy_kwh:.4f} kWh)")
        co2 = "n/a" if self.co2_kg is None else f"{1000 * self.co2_kg:,.1f} g CO2e"
        cost = ("not priced (no price per device-hour given)" if self.money is None
                else f"${self.money:,.4f} at ${self.price_per_device_hour:g}/device-hour")
        peak = "n/a" if self.peak_flops_per_s is None else _si(self.peak_flops_per_s, "FLOP/s")
        side = [(f"FLOPs ({label}, not trained)", _si(value, "FLOP"))
                for label, value in self.side_flops.items()]
        if side:
            side.append(("FLOPs (all)", _si(self.total_flops, "FLOP")))
        return [
            ("model", self.model),
            ("parameters", f"{self.parameters:,}"),
            ("tokens seen", f"{self.tokens:,}"),
            ("FLOPs per token", f"{self.flops_per_token:,.0f}"),
            ("FLOPs (model, total)", _si(self.flops, "FLOP")),
            *side,
            ("wall time", f"{self.wall_seconds:,.1f} s"),
            ("device", f"{self.devices} x {self.device}, {self.precision}"),
            ("host", self.host or "not recorded"),
            ("achieved", _si(self.achieved_flops_per_s, "FLOP/s")),
            ("peak (MFU denominator)", f"{peak}: {self.peak_label}"),
            ("MFU", mfu),
            ("energy", f"{energy} [{self.energy_method}]"),
            ("CO2", f"{co2} at {self.grid_g_per_kwh:g} g/kWh, PUE {self.pue:g}"),
            ("money", cost),
        ]

    def to_markdown(self) -> str:
        """A two-column table of every field, then the notes."""
        lines = ["| quantity | value |", "|---|---|"]
        lines += [f"| {name} | {value} |" for name, value in self._rows()]
        if self.notes:
            lines.append("")
            lines += [f"- {note}" for note in self.notes]
        return "\n".join(lines)

    def write(self, folder: str | Path) -> Path:
        """Write ``cost.json`` (every field) and ``cost.md`` (:meth:`to_markdown`) into
        ``folder`` (made if missing), each atomically: the one writer of a run's cost files.
        Returns the markdown's path (run reports include it)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(folder / "cost.json", self.to_dict())
        atomic_write_text(folder / "cost.md", self.to_markdown() + "\n")
        return folder / "cost.md"

    def log_session(self, folder: str | Path, session: str, status: str, **extra: Any) -> None:
        """Append this report to ``folder``'s :data:`SESSIONS_FILE` as the newest record of
        ``session`` (``status``: running, finished or failed; ``extra``: e.g. the stop reason):
        a resumed run's sessions, and a failed one's, all stay counted (``lmlab cost project``).
        """
        from datetime import UTC, datetime

        record = {"session": session, "status": status,
                  "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
                  **extra, **self.to_dict()}
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / SESSIONS_FILE, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")

    def summary_line(self) -> str:
        """One line for logs: tokens, FLOPs, time, MFU, energy, CO2, money."""
        parts = [f"{self.tokens:,} tokens", _si(self.flops, "FLOP")]
        parts += [f"+ {_si(value, 'FLOP')} {label}" for label, value in self.side_flops.items()]
        parts += [f"{self.wall_seconds:,.1f} s", _si(self.achieved_flops_per_s, "FLOP/s")]
        if self.mfu is not None:
            parts.append(f"MFU {100 * self.mfu:.1f}%")
        if self.energy_joules is not None:
            tag = " est." if self.energy_method.startswith("estimate") else ""
            parts.append(f"{self.energy_joules / 1000:,.1f} kJ{tag}")
        if self.co2_kg is not None:
            parts.append(f"{1000 * self.co2_kg:,.1f} g CO2e")
        if self.money is not None:
            parts.append(f"${self.money:,.4f}")
        return "cost: " + ", ".join(parts)


class CostTracker:
    """Accumulates a training run's tokens, time and energy into a :class:`CostReport`.

    ``config`` is the model's config; ``seq_len``, ``head``, ``sparse_prediction_fraction``
    and ``training`` go to :func:`flops_per_token`; ``precision`` and ``device`` pick the MFU
    denominator (``peak_flops_per_s`` overrides it; ``measure_peak=False`` leaves an uncached
    CPU peak unmeasured and MFU out); ``grid_g_per_kwh``, ``pue`` and ``price_per_hour`` (per
    device-hour) price the run; ``model_name`` labels it (default: the config's family).
    """

    def __init__(self, config, seq_len: int, precision: str = "fp32", device: str = "cpu",
                 devices: int = 1, head: str = "mlm",
                 sparse_prediction_fraction: float | None = None, training: bool = True,
                 peak_flops_per_s: float | None = None, measure_peak: bool = True,
                 energy_method: str = "auto", grid_g_per_kwh: float = DEFAULT_GRID_G_PER_KWH,
                 pue: float = 1.0, price_per_hour: float | None = None,
                 model_name: str | None = None):
        cost_settings({"price_per_hour": price_per_hour, "grid_g_per_kwh": grid_g_per_kwh})
        self.config = config
        self.seq_len = int(seq_len)
        self.precision = precision.lower()
        self.device = device
        self.devices = int(devices)
        self._flop_args = {"training": training, "head": head,
                           "sparse_prediction_fraction": sparse_prediction_fraction}
        if getattr(config, "is_encoder_decoder", False):
            # per source token at equal source and target lengths, until steps say otherwise
            self._fpt_cache: dict[int, float] = {self.seq_len: seq2seq_step_flops(
                config, self.seq_len, self.seq_len, self.seq_len, self.seq_len,
                training=training) / self.seq_len}
        else:
            self._fpt_cache = {self.seq_len: flops_per_token(config, self.seq_len,
                                                             **self._flop_args)}
        self._peak_override = peak_flops_per_s
        self._measure_peak = measure_peak
        self.energy_method = energy_method
        self.grid_g_per_kwh = grid_g_per_kwh
        self.pue = pue
        self.price_per_hour = price_per_hour
        self.model_name = model_name or getattr(config, "family", "model")
        self.tokens = 0
        self.flops = 0.0
        self.side_flops: dict[str, float] = {}
        self._meter: EnergyMeter | None = None  # set by start()
        self._start: float | None = None
        self._stopped_at: float | None = None

    def start(self) -> CostTracker:
        """Start the clock and the energy meter."""
        self._meter = EnergyMeter(self.device, method=self.energy_method, count=self.devices)
        self._meter.start()
        self._start = time.perf_counter()
        self._stopped_at = None
        return self

    def add_tokens(self, n: int, seq_len: int | None = None, flops: float | None = None) -> None:
        """Count ``n`` tokens of one step (at ``seq_len``, default the tracker's); ``flops``: the
        step's FLOPs when the caller counted them (an encoder-decoder's depend on both sides'
        lengths: :func:`~lmlab.cost.flops.seq2seq_step_flops`)."""
        if self._start is None:
            raise LmlabError("CostTracker.add_tokens() before start()", "call tracker.start()")
        if flops is None:
            length = int(seq_len or self.seq_len)
            if length not in self._fpt_cache:
                self._fpt_cache[length] = flops_per_token(self.config, length,
                                                          **self._flop_args)
            flops = int(n) * self._fpt_cache[length]
        self.tokens += int(n)
        self.flops += float(flops)
        self._meter.poll()

    def add_side_flops(self, flops: dict[str, float]) -> None:
        """Count FLOPs spent beside the trained model (label -> FLOPs; a distillation
        teacher's forward passes), reported apart from the model's training FLOPs."""
        for label, value in flops.items():
            self.side_flops[label] = self.side_flops.get(label, 0.0) + float(value)

    def stop(self) -> None:
        """Stop the clock and the meter (``report`` after this reports the finished run)."""
        if self._start is None:
            raise LmlabError("CostTracker.stop() before start()", "call tracker.start()")
        if self._stopped_at is None:
            self._stopped_at = time.perf_counter()
            self._meter.stop()

    def _peak(self) -> tuple[float | None, str]:
        if self._peak_override is not None:
            return self._peak_override, "given by the caller"
        # the fastest path this host has for the precision (oneDNN fp32 can run 2x torch's
        # default MKL path): MFU against the slower one would flatter the run
        found = device_peak(self.device, self.precision, path="best", measure=self._measure_peak)
        if found is None:
            return None, "not measured (run `lmlab cost peak`)"
        return found

    def report(self) -> CostReport:
        """The cost so far (or of the finished run after :meth:`stop`)."""
        if self._start is None:
            raise LmlabError("CostTracker.report() before start()", "call tracker.start()")
        end = self._stopped_at if self._stopped_at is not None else time.perf_counter()
        seconds = max(end - self._start, 1e-9)
        joules = self._meter.poll()  # once stopped, the meter's final reading
        method = self._meter.method
        achieved = self.flops / seconds
        peak, label = self._peak()
        mfu = None if not peak else achieved / (peak * self.devices)
        counting = counting_note(self.config)
        notes = [f"FLOPs count matmuls only (2 per multiply-add; training = 3 x forward; "
                 f"{counting}); see lmlab.cost.flops."]
        if self.side_flops:
            notes.append(f"{', '.join(self.side_flops).capitalize()}: forward FLOPs of a model "
                         "that is not trained, listed apart; achieved FLOP/s and MFU count the "
                         "trained model's FLOPs only.")
        if method.startswith("estimate"):
            notes.append("Energy is an ESTIMATE from rated power x time, not a measurement.")
        elif method.startswith("rapl"):
            notes.append("RAPL measures the whole CPU package, other processes included.")
        average_seq = self.flops and self.tokens and self.flops / self.tokens
        return CostReport(
            model=self.model_name,
            parameters=int(self.config.num_parameters()),
            tokens=self.tokens,
            flops=self.flops,
            flops_per_token=float(average_seq or self._fpt_cache[self.seq_len]),
            wall_seconds=seconds,
            device=self.device,
            devices=self.devices,
            precision=self.precision,
            achieved_flops_per_s=achieved,
            peak_flops_per_s=peak,
            peak_label=label,
            mfu=mfu,
            energy_joules=joules,
            energy_method=method,
            grid_g_per_kwh=self.grid_g_per_kwh,
            pue=self.pue,
            co2_kg=co2_kg(joules, self.grid_g_per_kwh, self.pue),
            price_per_device_hour=self.price_per_hour,
            money=(None if self.price_per_hour is None
                   else money(seconds, self.devices, self.price_per_hour)),
            notes=notes,
            host=describe_host(),
            side_flops=dict(self.side_flops),
        )
