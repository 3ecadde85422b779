"""What training costs: FLOPs, peak throughput, MFU, energy, CO2 and money.

One concept a module, none importing torch at import time except :mod:`~lmlab.cost.shapes`
and :mod:`~lmlab.cost.precision`: analytic FLOPs (``flops``) and a counter to check them
(``flop_counter``), measured and data-sheet peaks (``peak``), energy (``energy``), the
trainer's ``CostTracker`` and its ``CostReport`` (``report``), pre-run estimates
(``estimate``, ``presets``), the choice of bf16 or fp32 (``precision``, ``shapes``) and
Kaplan-style power-law fits over runs' compute (``scaling``).
Usage: docs/cost.md.
"""

from __future__ import annotations

from lmlab.cost.energy import EnergyMeter, EnergyReading
from lmlab.cost.estimate import RunEstimate, estimate_run
from lmlab.cost.flops import FlopBreakdown, flops_breakdown, flops_per_token
from lmlab.cost.peak import GPU_SPECS, cpu_peaks, device_peak
from lmlab.cost.report import CostReport, CostTracker, co2_kg, money

__all__ = [
    "GPU_SPECS", "CostReport", "CostTracker", "EnergyMeter", "EnergyReading", "FlopBreakdown",
    "RunEstimate", "co2_kg", "cpu_peaks", "device_peak", "estimate_run", "flops_breakdown",
    "flops_per_token", "money",
]
