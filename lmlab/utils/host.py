"""One line that says which machine produced a figure.

Every report lmlab prints (run report, cost report, ``lmlab runs show``, the demo report) names
the host, because timings, MFU and even the last digits of a loss depend on it: the CPU model,
the vector ISA its kernels can use (AVX2, AVX-512, AVX512-BF16, AMX), the threads torch ran
with and the torch version. Hypervisors often hide the real model name ("AMD EPYC"), so the
CPU family and model numbers are shown next to it, e.g.::

    AMD EPYC (family 26 model 2), AVX-512 + AVX512-BF16, 2 threads, torch 2.13.0
"""

from __future__ import annotations

import os
import platform
from functools import lru_cache

# /proc/cpuinfo flag -> the name people know, best first; describe_host lists the widest
# vector ISA and then every bf16/AMX extension present.
_VECTOR_ISAS = (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"), ("sse4_2", "SSE4.2"),
                ("asimd", "NEON"))
_EXTRA_ISAS = (("avx512_bf16", "AVX512-BF16"), ("avx512_fp16", "AVX512-FP16"),
               ("amx_bf16", "AMX-BF16"), ("sve", "SVE"), ("bf16", "BF16"))
# environment variables that hold the kernels below what the CPU has (how a developer sees
# what an AVX2 host would: docs/setup.md); a figure measured under them says so
KERNEL_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
               "MKL_ENABLE_INSTRUCTIONS", "FBGEMM_ENABLE_INSTRUCTIONS")


def cpu_from_cpuinfo(text: str) -> tuple[str, str]:
    """The CPU name (with family/model numbers when /proc/cpuinfo gives them) and its ISA
    summary ("AVX-512 + AVX512-BF16"), from the text of /proc/cpuinfo. Only the first
    processor block is read; every core of one machine reports the same."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # end of the first processor block
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip().lower(), value.strip())
    name = fields.get("model name") or fields.get("hardware") or fields.get("cpu model") or ""
    if "cpu family" in fields and "model" in fields:
        name = f"{name or 'cpu'} (family {fields['cpu family']} model {fields['model']})"
    flags = set((fields.get("flags") or fields.get("features") or "").split())
    isas = [next((label for flag, label in _VECTOR_ISAS if flag in flags), "")]
    isas += [label for flag, label in _EXTRA_ISAS if flag in flags]
    return name, " + ".join(label for label in isas if label)


@lru_cache(maxsize=1)
def _cpu() -> tuple[str, str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            name, isa = cpu_from_cpuinfo(handle.read())
    except OSError:  # not Linux: the platform module knows the name, not the ISA
        name, isa = "", ""
    return name or platform.processor() or platform.machine() or "unknown cpu", isa


def cpu_name() -> str:
    """The CPU's name with its family and model numbers, e.g. "AMD EPYC (family 26 model 2)"."""
    return _cpu()[0]


def describe_host(threads: int | None = None) -> str:
    """One line naming the CPU, its vector ISA, the torch thread count and the torch version,
    e.g. "AMD EPYC (family 26 model 2), AVX-512 + AVX512-BF16, 2 threads, torch 2.13.0".
    ``threads`` overrides ``torch.get_num_threads()`` (a report written for a past run)."""
    import torch

    name, isa = _cpu()
    caps = [f"{var}={os.environ[var]}" for var in KERNEL_CAPS if os.environ.get(var)]
    if caps:
        isa = f"{isa or 'ISA unknown'} (kernels capped: {' '.join(caps)})"
    threads = threads or torch.get_num_threads()
    parts = [name, isa or "ISA unknown", f"{threads} thread{'s' if threads != 1 else ''}",
             f"torch {torch.__version__}"]
    if torch.cuda.is_available():
        parts.append(f"GPU {torch.cuda.get_device_name(0)}")
    return ", ".join(parts)
