"""bf16 or fp32: whether bf16 is a speed-up on this device, and a warning where it is not.

Without native bf16 instructions (AVX512-BF16, AMX, Arm BF16) PyTorch emulates bf16 matmuls,
5-60x slower than fp32; with them, bf16 was 4x fp32 on one host and 0.5x on another. So
``precision="auto"`` measures; the figures are in docs/training.md (the bf16 bullets).
"""

from __future__ import annotations

import warnings
from functools import lru_cache

import torch

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # x86 /proc/cpuinfo; Arm "Features"


def native_bf16_from_cpuinfo(text: str) -> bool | None:
    """Whether a /proc/cpuinfo text lists a bf16 instruction flag (None: no flags line)."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return any(flag in value.split() for flag in NATIVE_BF16_FLAGS)
    return None


@lru_cache(maxsize=1)
def cpu_has_native_bf16() -> bool | None:
    """True when the CPU advertises bf16 instructions, False when it does not, None when its
    flags cannot be read (not Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            return native_bf16_from_cpuinfo(handle.read())
    except OSError:
        return None


class SlowPrecisionWarning(UserWarning):
    """The requested precision runs much slower than fp32 on this device."""


_warned = False


def warn_if_slow_bf16(device_type: str = "cpu") -> bool:
    """Warn (once per process) when bf16 is asked for on a CPU without native bf16; returns
    whether it warned. GPUs and CPUs with bf16 instructions pass silently."""
    global _warned
    if device_type != "cpu" or cpu_has_native_bf16() is not False:
        return False
    if not _warned:
        warnings.warn(
            "bf16 was requested, but this CPU has no bf16 instructions (no AVX512-BF16, AMX or "
            "Arm BF16): PyTorch emulates bf16 matmuls here, 5-60x slower than fp32. "
            "Fix: use --precision fp32 (or drop --bf16 / dtype=torch.bfloat16) on this machine.",
            SlowPrecisionWarning, stacklevel=3)
        _warned = True
    return True


def precision_autocast(precision: str, device_type: str = "cpu") -> torch.autocast:
    """The autocast context for a run's ``precision`` ("fp32": disabled, "bf16": bfloat16),
    warning once first when bf16 would be emulated. Every bf16 path of lmlab enters through
    here, so the warning cannot be forgotten on one of them."""
    if precision == "bf16":
        warn_if_slow_bf16(device_type)
    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=precision == "bf16")


BF16_MIN_SPEEDUP = 1.2  # bf16 must beat fp32 by this much to be worth its rounding


def auto_precision(device_type: str = "cpu", model: torch.nn.Module | None = None,
                   tokens: int = 2048) -> tuple[str, str]:
    """("bf16" or "fp32", why) for ``precision="auto"``: bf16 where it is measurably faster.

    Never assumed from the CPU's flags alone: on a CPU with bf16 instructions, ``model``'s own
    linear layers at ``tokens`` rows (:func:`lmlab.cost.shapes.model_linear_times`, cached) or,
    without a model, the square-matrix peaks decide; bf16 must be :data:`BF16_MIN_SPEEDUP`
    times faster than fp32. A CPU without them is fp32 unmeasured; a GPU bf16 where supported.
    """
    if device_type == "cuda":
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return "bf16", "this GPU supports bf16 autocast"
        return "fp32", "this GPU has no bf16 support"
    if cpu_has_native_bf16() is False:
        return "fp32", "this CPU has no bf16 instructions (bf16 would be emulated, 5-60x slower)"
    if model is not None:
        from lmlab.cost.shapes import linear_shapes, model_linear_times

        if linear_shapes(model):
            times = model_linear_times(model, tokens)
            ratio = times.speedup("bf16")
            measured = (f"the model's own linear layers ({times.shapes} shapes at {tokens} "
                        f"tokens, forward and backward) ran {ratio:.1f}x as fast in bf16 as in "
                        f"fp32 on this host")
            return _decide(ratio, measured)
    from lmlab.cost.peak import cpu_peaks

    peaks = cpu_peaks().peaks
    fp32, bf16 = peaks.get("fp32"), peaks.get("bf16")
    if not fp32 or not bf16:
        return "fp32", "no bf16 matmul rate could be measured on this CPU"
    ratio = bf16 / fp32
    return _decide(ratio, f"measured bf16 {bf16 / 1e9:,.0f} against fp32 {fp32 / 1e9:,.0f} "
                          f"GFLOP/s on this host ({ratio:.1f}x)")


def _decide(ratio: float, measured: str) -> tuple[str, str]:
    if ratio >= BF16_MIN_SPEEDUP:
        return "bf16", measured
    return "fp32", f"{measured}: under the {BF16_MIN_SPEEDUP}x that bf16 must gain"
