"""What training costs: FLOPs, peak throughput, MFU, energy, CO2 and money.

Modules (one concept each; none imports torch at import time):

* :mod:`lmlab.cost.flops` -- analytic FLOPs per token from a ``TransformerConfig``
  (``flops_per_token``, ``flops_breakdown``); conventions in its docstring.
* :mod:`lmlab.cost.flop_counter` -- count a real model's FLOPs with torch's flop counter
  (``measure_flops``), to check the formulas against any model.
* :mod:`lmlab.cost.peak` -- this CPU's measured matmul peaks (cached per machine) and GPU
  data-sheet peaks (``device_peak``, ``cpu_peaks``, ``GPU_SPECS``).
* :mod:`lmlab.cost.energy` -- ``EnergyMeter``: RAPL, NVML, or a labelled TDP estimate.
* :mod:`lmlab.cost.report` -- ``CostTracker`` (what the trainer calls) and ``CostReport``;
  CO2 and money arithmetic.
* :mod:`lmlab.cost.estimate` -- ``estimate_run``: a run's cost before it starts.
* :mod:`lmlab.cost.presets` -- the published model sizes the estimator knows.

The trainer's use::

    from lmlab.cost import CostTracker
    tracker = CostTracker(config, seq_len=128, precision="fp32", device="cpu")
    tracker.start()
    ...; tracker.add_tokens(tokens_in_this_step)    # once per optimiser step
    report = tracker.report()                       # CostReport: .to_markdown(), .to_dict()
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
