"""Estimate a run's cost before it starts: time, energy, CO2 and money from FLOPs and an MFU.

Time is tokens x FLOPs per token / (devices x peak x MFU), energy rated power x time (an
estimate), CO2 and money as in :mod:`lmlab.cost.report`. Every assumption is listed in the
result, because the answer is only as good as they are.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from lmlab.cost.energy import DEFAULT_CPU_WATTS_PER_CORE
from lmlab.cost.flops import counting_note, parse_seq_len_schedule, schedule_flops_per_token
from lmlab.cost.peak import default_threads, device_peak, gpu_spec
from lmlab.cost.presets import default_head, preset_config
from lmlab.cost.report import DEFAULT_GRID_G_PER_KWH, LB_PER_KG, co2_kg, money
from lmlab.utils.checks import check_at_least, check_positive
from lmlab.utils.errors import LmlabError

PF_DAY_FLOPS = 8.64e19  # a PF-s-day: 1e15 FLOP/s for a day (GPT-3's and Kaplan et al.'s unit)


@dataclass
class RunEstimate:
    """A pre-run cost estimate and the assumptions behind it."""

    model: str
    tokens: float
    flops_per_token: float
    total_flops: float
    device: str
    devices: int
    precision: str
    peak_flops_per_s: float
    peak_label: str
    mfu: float
    seconds: float
    power_watts_per_device: float
    energy_joules: float
    grid_g_per_kwh: float
    pue: float
    co2_kg: float
    price_per_device_hour: float | None
    money: float | None
    assumptions: list[str] = field(default_factory=list)

    @property
    def hours(self) -> float:
        return self.seconds / 3600.0

    @property
    def energy_kwh(self) -> float:
        return self.energy_joules / 3.6e6

    @property
    def pf_days(self) -> float:
        """The compute in PF-s-days (1e15 FLOP/s for a day, GPT-3's unit)."""
        return self.total_flops / PF_DAY_FLOPS

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "hours": self.hours, "energy_kwh": self.energy_kwh,
                "pf_days": self.pf_days}

    def to_text(self) -> str:
        """The estimate, then its assumptions, for the terminal."""
        lines = [
            f"Estimate for {self.model}: {self.tokens:.3g} tokens on {self.devices} x "
            f"{self.device} ({self.precision})",
            f"  compute:  {self.total_flops:.3e} FLOPs ({self.flops_per_token:,.0f} per token) "
            f"= {self.pf_days:,.4g} PF-s-days",
            f"  time:     {self.hours:,.1f} h ({self.hours / 24:,.2f} days) wall clock",
            f"  energy:   {self.energy_kwh:,.1f} kWh at the devices (ESTIMATE: rated power x "
            f"time); {self.energy_kwh * self.pue:,.1f} kWh with PUE {self.pue:g}",
            f"  CO2:      {self.co2_kg:,.1f} kg CO2e ({self.co2_kg * LB_PER_KG:,.0f} lb) at "
            f"{self.grid_g_per_kwh:g} g/kWh",
        ]
        if self.money is None:
            lines.append("  money:    not priced (pass --price-per-hour)")
        else:
            lines.append(f"  money:    ${self.money:,.0f} at ${self.price_per_device_hour:g} "
                         "per device-hour")
        lines.append("assumptions:")
        lines += [f"  - {item}" for item in self.assumptions]
        return "\n".join(lines)


def default_precision(device: str) -> str:
    """bf16 where the device has it, else fp16 (tensor cores), else fp32; fp32 on CPUs."""
    if device.lower() == "cpu":
        return "fp32"
    return next((p for p in ("bf16", "fp16") if p in gpu_spec(device).peaks), "fp32")


def estimate_run(model: str, tokens: float, device: str = "v100", devices: int = 1,
                 precision: str | None = None, mfu: float = 0.3, seq_len: str | int = 512,
                 head: str | None = None, sparse_prediction_fraction: float | None = None,
                 causal_attention: str = "full", price_per_hour: float | None = None,
                 grid_g_per_kwh: float | None = None, pue: float = 1.0,
                 peak_flops_per_s: float | None = None, power_watts: float | None = None,
                 cpu_threads: int | None = None, global_tokens: int = 0) -> RunEstimate:
    """Estimate the cost of training ``model`` (a :func:`~lmlab.cost.presets.preset_names`
    name) on ``tokens`` tokens on ``devices`` x ``device`` (``"cpu"``: the measured peak, or a
    GPU table key) at an assumed ``mfu``. ``seq_len`` is a length or a schedule of step
    fractions (``"128:0.9,512:0.1"``); ``head`` defaults by the family; ``peak_flops_per_s``
    and ``power_watts`` override the device's (per device). The options are those of
    ``lmlab cost estimate`` (docs/cost.md).
    """
    check_positive(tokens, "--tokens")
    if not 0 < mfu <= 1:
        raise LmlabError(f"MFU must be in (0, 1], got {mfu}", "pass e.g. --mfu 0.3")
    check_at_least(devices, 1, "--count")
    if peak_flops_per_s is not None and not peak_flops_per_s > 0:
        raise LmlabError(f"peak must be positive, got {peak_flops_per_s:g} FLOP/s",
                         "pass e.g. --peak-tflops 125, or leave it out for the data sheet's")
    check_positive(power_watts, "--power-watts")
    config = preset_config(model)
    head = head or default_head(config)
    schedule = parse_seq_len_schedule(seq_len)
    precision = (precision or default_precision(device)).lower()
    grid = DEFAULT_GRID_G_PER_KWH if grid_g_per_kwh is None else grid_g_per_kwh

    fpt = schedule_flops_per_token(config, schedule, training=True, head=head,
                                   sparse_prediction_fraction=sparse_prediction_fraction,
                                   causal_attention=causal_attention,
                                   global_tokens=global_tokens)
    total = fpt * tokens
    if peak_flops_per_s is not None:
        peak, peak_label = peak_flops_per_s, "given on the command line"
    else:
        peak, peak_label = device_peak(device, precision)
    seconds = total / (devices * peak * mfu)

    if power_watts is not None:
        watts, power_label = power_watts, "given on the command line"
    elif device.lower() == "cpu":
        threads = cpu_threads or default_threads()
        watts = threads * DEFAULT_CPU_WATTS_PER_CORE
        power_label = f"{threads} cores x {DEFAULT_CPU_WATTS_PER_CORE:g} W/core TDP share"
    else:
        spec = gpu_spec(device)
        watts, power_label = spec.tdp_watts, f"{spec.name} TDP, drawn the whole time"
    energy = devices * watts * seconds

    sched_text = ", ".join(f"{length} for {100 * share:g}% of steps" for length, share in schedule)
    prediction = ("every position" if sparse_prediction_fraction is None
                  else f"{100 * sparse_prediction_fraction:g}% of positions")
    assumptions = [
        f"precision {precision}; peak {peak / 1e12:,.3g} TFLOP/s per device ({peak_label})",
        f"MFU {mfu:g} (model FLOPs / peak); sustained for the whole run",
        f"FLOPs per token {fpt:,.0f} = 3 x forward matmuls (2 FLOPs per multiply-add, "
        f"{counting_note(config)}), sequence length "
        f"{sched_text}",
        f"prediction head '{head}' over {prediction}",
        f"power {watts:g} W per device ({power_label}); energy is an estimate",
        f"grid {grid:g} g CO2e/kWh, PUE {pue:g}",
        "time excludes data loading, evaluation, checkpointing and restarts",
    ]
    return RunEstimate(
        model=model, tokens=float(tokens), flops_per_token=fpt, total_flops=total,
        device=device, devices=devices, precision=precision, peak_flops_per_s=peak,
        peak_label=peak_label, mfu=mfu, seconds=seconds, power_watts_per_device=watts,
        energy_joules=energy, grid_g_per_kwh=grid, pue=pue,
        co2_kg=co2_kg(energy, grid, pue), price_per_device_hour=price_per_hour,
        money=None if price_per_hour is None else money(seconds, devices, price_per_hour),
        assumptions=assumptions,
    )


def implied_mfu(total_flops: float, hours: float, devices: int, peak_flops_per_s: float) -> float:
    """The MFU a reported run must have reached: FLOPs / (time x devices x peak)."""
    return total_flops / (hours * 3600.0 * devices * peak_flops_per_s)
