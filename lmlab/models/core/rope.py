"""RoPE's inverse frequencies and the context-extension scalings of ``config.rope_scaling``
(linear, dynamic NTK, YaRN, Llama 3's), computed as transformers 5's ``modeling_rope_utils``
does: :data:`ROPE_TYPES` maps each type to its keys and its frequency function."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from lmlab.utils.errors import LmlabError

#: the pre-training context of YaRN and Llama 3 (default: max_position_embeddings)
ORIGINAL = "original_max_position_embeddings"


def _powers(head_dim: int, theta: float | torch.Tensor) -> torch.Tensor:
    """``theta^(2i/d)`` for i < d/2, float32: the wavelengths / 2pi of plain RoPE."""
    return theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)


def _linear(head_dim: int, theta: float, s: dict[str, Any], max_positions: int,
            seq_len: torch.Tensor | None) -> tuple[torch.Tensor, float]:
    """Position interpolation (kaiokendev; Chen et al. 2023): every frequency over ``factor``."""
    return 1.0 / _powers(head_dim, theta) / s["factor"], 1.0


def _dynamic(head_dim: int, theta: float, s: dict[str, Any], max_positions: int,
             seq_len: torch.Tensor | None) -> tuple[torch.Tensor, float]:
    """Dynamic NTK (bloc97, emozilla): the base grows with the sequence beyond max positions."""
    factor = s["factor"]
    length = max_positions if seq_len is None else torch.clamp(seq_len, min=max_positions)
    base = theta * ((factor * length / max_positions) - (factor - 1)) ** (head_dim / (head_dim - 2))
    return 1.0 / _powers(head_dim, base), 1.0


def _yarn(head_dim: int, theta: float, s: dict[str, Any], max_positions: int,
          seq_len: torch.Tensor | None) -> tuple[torch.Tensor, float]:
    """YaRN (Peng et al. 2023): interpolate the low frequencies, keep the high ones, ramp in
    between (``beta_fast``/``beta_slow`` rotations); cos/sin scaled by the attention factor."""
    original = s[ORIGINAL]
    factor = s.get("factor") or max_positions / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = s.get("attention_factor")
    if attention is None:
        attention = (float(mscale(factor, s["mscale"]) / mscale(factor, s["mscale_all_dim"]))
                     if s.get("mscale") and s.get("mscale_all_dim") else mscale(factor))

    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(s.get("beta_fast") or 32), correction_dim(s.get("beta_slow") or 1)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    high += 0.001 if low == high else 0  # no zero-width ramp
    ramp = torch.clamp((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    powers = theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    keep = 1 - ramp  # 1: extrapolate (high frequencies), 0: interpolate
    return 1.0 / (factor * powers) * (1 - keep) + 1.0 / powers * keep, attention


def _llama3(head_dim: int, theta: float, s: dict[str, Any], max_positions: int,
            seq_len: torch.Tensor | None) -> tuple[torch.Tensor, float]:
    """Llama 3.1's: wavelengths above original/low_freq_factor over ``factor``, those below
    original/high_freq_factor kept, a smooth blend between."""
    inv_freq = 1.0 / _powers(head_dim, theta)
    factor, low, high, original = (s["factor"], s["low_freq_factor"], s["high_freq_factor"],
                                   s[ORIGINAL])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < original / high) * ~(wavelen > original / low)
    return torch.where(medium, smoothed, scaled), 1.0


@dataclass(frozen=True)
class RopeType:
    """One scaling: its frequency function, the keys of ``rope_scaling`` it reads, and
    whether its frequencies follow the sequence length (recomputed per forward)."""

    frequencies: Callable[..., tuple[torch.Tensor, float]]
    required: tuple[str, ...] = ("factor",)
    optional: tuple[str, ...] = ()
    per_length: bool = False


ROPE_TYPES: dict[str, RopeType] = {
    "linear": RopeType(_linear),
    "dynamic": RopeType(_dynamic, per_length=True),
    "yarn": RopeType(_yarn, ("factor", ORIGINAL), ("attention_factor", "beta_fast",
                                                    "beta_slow", "mscale", "mscale_all_dim",
                                                    "truncate")),
    "llama3": RopeType(_llama3, ("factor", ORIGINAL, "low_freq_factor", "high_freq_factor")),
}


def rope_type_of(scaling: dict[str, Any] | None) -> str:
    """The type of a ``rope_scaling`` dict (``rope_type``, or transformers 4's ``type``)."""
    scaling = scaling or {}
    return scaling.get("rope_type") or scaling.get("type") or "default"


def check_rope_scaling(scaling: dict[str, Any] | None, max_positions: int
                       ) -> dict[str, Any] | None:
    """``scaling`` checked and normalised (``rope_type`` key, the original context filled in
    as transformers does); None for plain RoPE. Unknown types, missing or unknown keys refused."""
    kind = rope_type_of(scaling)
    if kind == "default":
        return None
    spec = ROPE_TYPES.get(kind)
    if spec is None:
        raise LmlabError(f"RoPE scaling {kind!r} is not supported",
                         f"supported rope types: default, {', '.join(ROPE_TYPES)}")
    values = {k: v for k, v in scaling.items() if k not in ("rope_type", "type")}
    if kind in ("yarn", "llama3"):
        values.setdefault(ORIGINAL, max_positions)
    missing = [key for key in spec.required if key not in values]
    unknown = sorted(set(values) - set(spec.required) - set(spec.optional))
    if missing or unknown:
        raise LmlabError(f"rope_scaling of type {kind!r}: "
                         + "; ".join(f"{what} {', '.join(keys)}" for what, keys in
                                     (("missing", missing), ("unknown keys", unknown)) if keys),
                         f"{kind} takes {', '.join(spec.required + spec.optional)}")
    factor = values["factor"]
    if not (factor is None and kind == "yarn") and not (
            isinstance(factor, int | float) and factor > 0):
        raise LmlabError(f"rope_scaling factor {factor!r} is not a positive number",
                         "give the context extension factor, e.g. 2.0")
    return {"rope_type": kind, **values}


def rope_frequencies(head_dim: int, theta: float, scaling: dict[str, Any] | None,
                     max_positions: int, seq_len: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, float]:
    """The inverse frequencies (head_dim/2,) and the cos/sin factor of ``scaling`` (a checked
    ``rope_scaling``; None: plain RoPE); ``seq_len`` only moves dynamic NTK's."""
    if scaling is None:
        return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)), 1.0
    return ROPE_TYPES[scaling["rope_type"]].frequencies(head_dim, theta, scaling, max_positions,
                                                        seq_len)
