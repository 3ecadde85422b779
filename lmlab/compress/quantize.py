"""Post-training dynamic int8 quantisation of the linear layers, for CPU inference.

Every plain ``nn.Linear`` becomes an :class:`Int8Linear` (int8 weight with a symmetric scale per
tensor or per output channel; each input quantised on the fly to 8 bits, by default with one
range per token; int8 products with int32 accumulation, rescaled to fp32), calling ATen's int8
GEMMs (fbgemm or oneDNN) directly. The engine of each layer shape, and whether int8 pays for it
at all, is measured on the host once (cached with ``precision="auto"``'s timings). Q8BERT's
scheme without its quantisation-aware training; why these kernels and not torch.ao, torchao or
ONNX Runtime, and the measurements: docs/compression-inference.md.
"""

from __future__ import annotations

import contextlib
import functools
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmlab.interop.folders import QUANTIZATION_FILE
from lmlab.utils.errors import LmlabError

GRANULARITIES = ("per-tensor", "per-channel")
ACTIVATIONS = ("per-token", "per-tensor")
CANDIDATES = ("x86", "onednn")  # the engines measured ("fbgemm" runs x86's kernels)
AUTO = "auto"
AUTO_TOKENS = 512  # rows the engine choice times each layer shape at (e.g. 4 x 128 tokens)
FORMAT_VERSION = 1
METHOD = "int8-dynamic"


def int8_engines() -> list[str]:
    """The int8 engines of this torch build that lmlab measures and accepts."""
    return [e for e in torch.backends.quantized.supported_engines if e in CANDIDATES + ("fbgemm",)]


@contextlib.contextmanager
def quantized_engine(engine: str) -> Iterator[None]:
    """Run the block with ``torch.backends.quantized.engine = engine``, then restore it."""
    previous = torch.backends.quantized.engine
    if previous != engine:
        torch.backends.quantized.engine = engine
    try:
        yield
    finally:
        if previous != engine:
            torch.backends.quantized.engine = previous


def _qint8(values: torch.Tensor, scale: torch.Tensor | float, zero_point: Any) -> torch.Tensor:
    """``values`` as torch's qint8 tensor, per channel (dim 0) where ``scale`` is a vector.
    torch 2.13 deprecates the quantised tensor type (pytorch issue 184982) that its int8
    kernels still take; the warning would repeat on every layer."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*quantized tensor creation", category=UserWarning)
        if isinstance(scale, torch.Tensor) and scale.dim():
            return torch.quantize_per_channel(values.float(), scale.double(), zero_point.long(), 0,
                                              torch.qint8)
        return torch.quantize_per_tensor(values.float(), float(scale), int(zero_point),
                                         torch.qint8)


@functools.cache
def full_range_exact(engine: str) -> bool:
    """Whether ``engine``'s int8 products are exact, in this process, with 8-bit activations
    and 8-bit weights; where not, :class:`Int8Linear` rounds its weights to 7 bits (|q| <= 64).

    Without VNNI, pairs of uint8 x int8 products are added in 16 bits and saturate beyond
    |q| = 64; rather than parse CPU flags, ``ONEDNN_MAX_CPU_ISA`` and
    ``FBGEMM_ENABLE_INSTRUCTIONS``, one product whose every pair overflows 16 bits asks the
    kernel, once per process and engine (docs/compression-inference.md)."""
    weight = _qint8(torch.full((8, 64), 127.0), 1.0, 0)
    x = torch.full((2, 64), 255.0)
    x[:, 0] = 0  # range [0, 255]: scale 1, zero point 0, so the int32 sums come back as they are
    with quantized_engine(engine):
        y = torch.ops.quantized.linear_dynamic(x, torch.ops.quantized.linear_prepack(weight, None),
                                               False)
    return torch.equal(y, x @ weight.dequantize().T)


def weight_levels(engine: str) -> float:
    """max|W| / scale: 127.5 (torch's qint8 convention), or 64 where ``engine``'s kernels would
    saturate 8-bit weights against 8-bit activations on this CPU (:func:`full_range_exact`)."""
    return 127.5 if full_range_exact(engine) else 64.0


class Int8Linear(nn.Module):
    """A linear layer with int8 weights and dynamically quantised 8-bit activations.

    Its state dict holds plain tensors: ``weight_int8`` (out, in) int8, ``weight_scale`` (a
    scalar, or (out,) per channel; float64 as the kernels keep it), ``weight_zero_point``
    (zeros: the weights are symmetric) and ``bias`` (fp32, when the layer has one). Loading
    them packs the weight for this host's kernels (halving int8 values beyond 64 where they
    would saturate: :func:`weight_levels`).

    ``activations="per-token"`` quantises each row of the input with its own range: every row
    is shifted and scaled to [-0.5, 0.5] before the kernel's one-range-per-call quantisation,
    and the shift and scale are undone on the output (one outlier token no longer coarsens
    every other token's steps); ``"per-tensor"`` gives the whole input one range (torch's
    dynamic scheme, one pass less over the input and output).
    """

    def __init__(self, in_features: int, out_features: int, packed: Any, engine: str,
                 granularity: str, has_bias: bool, activations: str = "per-token"):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.engine, self.granularity, self.has_bias = engine, granularity, has_bias
        self.activations = activations
        self._packed, self._bias, self._rowsum = packed, None, None

    @classmethod
    def from_linear(cls, linear: nn.Linear, engine: str | None = None,
                    granularity: str = "per-tensor",
                    activations: str = "per-token") -> Int8Linear:
        """Quantise ``linear``'s weight: symmetric, scale = max|W| / :func:`weight_levels`
        (per tensor or per output row), torch's MinMaxObserver convention for qint8 where the
        kernels take 8 bits. ``engine`` None: the fastest measured for this shape."""
        weight = linear.weight.detach().float()
        engine = engine or fastest_engine(linear.in_features, linear.out_features, activations)
        amax = weight.abs().amax(dim=1) if granularity == "per-channel" else weight.abs().amax()
        scale = (amax / weight_levels(engine)).clamp(min=torch.finfo(torch.float32).eps).double()
        layer = cls(linear.in_features, linear.out_features, None, engine, granularity,
                    linear.bias is not None, activations)
        bias = linear.bias.detach().float() if linear.bias is not None else None
        layer._set_weight(weight, scale, torch.zeros_like(scale, dtype=torch.int64), bias)
        return layer

    def _set_weight(self, weight: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                    bias: torch.Tensor | None) -> None:
        """Round ``weight`` (fp32, or int8 values already rounded) with ``scale`` and pack it for
        this layer's engine; per-token activations add the bias after the kernel."""
        qweight = _quantize_weight(weight, scale, zero_point, self.engine)
        self._bias = None if bias is None else bias.detach().float().clone()
        per_token = self.activations == "per-token"
        if per_token:  # W_q @ 1 (out,): what a per-row shift of the input adds to each output
            self._rowsum = qweight.dequantize().sum(1)
        with quantized_engine(self.engine):
            self._packed = torch.ops.quantized.linear_prepack(qweight,
                                                              None if per_token else self._bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The kernels take fp32 only; under bf16 autocast (--precision bf16) the attention
        # products hand over bf16, which fp32 holds exactly: the output keeps the input's dtype.
        dtype, flat = x.dtype, x.float().reshape(-1, x.shape[-1])  # (N, in)
        with quantized_engine(self.engine):
            if self.activations == "per-tensor":
                y = torch.ops.quantized.linear_dynamic(flat, self._packed, False)
            else:
                hi, lo = flat.amax(1, keepdim=True), flat.amin(1, keepdim=True)  # (N, 1)
                mid = (hi + lo) * 0.5
                span = (hi - lo).clamp_(min=torch.finfo(torch.float32).tiny)
                # every row in [-0.5, 0.5]: the kernel's one range gives each row all 256 steps
                z = torch.ops.quantized.linear_dynamic((flat - mid).div_(span), self._packed,
                                                       False)
                y = mid * self._rowsum  # (N, out): W (z * span + mid) = span * (W z) + mid * W 1
                if self._bias is not None:
                    y.add_(self._bias)
                y.addcmul_(z, span)
        y = y.view(*x.shape[:-1], self.out_features)
        return y if dtype == torch.float32 else y.to(dtype)

    def int8_state(self) -> dict[str, torch.Tensor]:
        """The weight as int8 values, scale(s) and zero point(s), and the fp32 bias."""
        with quantized_engine(self.engine):
            qweight, _ = torch.ops.quantized.linear_unpack(self._packed)
        if qweight.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
            scale = qweight.q_per_channel_scales().double()
            zero_point = qweight.q_per_channel_zero_points().long()
        else:
            scale = torch.tensor(qweight.q_scale(), dtype=torch.float64)
            zero_point = torch.tensor(qweight.q_zero_point(), dtype=torch.int64)
        state = {"weight_int8": qweight.int_repr(), "weight_scale": scale,
                 "weight_zero_point": zero_point}
        if self._bias is not None:
            state["bias"] = self._bias
        return state

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        for name, tensor in self.int8_state().items():
            destination[prefix + name] = tensor

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        names = ["weight_int8", "weight_scale", "weight_zero_point"] + (
            ["bias"] if self.has_bias else [])
        missing = [prefix + n for n in names if prefix + n not in state_dict]
        if missing:
            missing_keys.extend(missing)
            return
        weight = state_dict[prefix + "weight_int8"]
        if weight.dtype != torch.int8 or tuple(weight.shape) != (self.out_features,
                                                                 self.in_features):
            error_msgs.append(f"{prefix}weight_int8: expected int8 ({self.out_features}, "
                              f"{self.in_features}), got {weight.dtype} {tuple(weight.shape)}")
            return
        self._set_weight(weight, state_dict[prefix + "weight_scale"],
                         state_dict[prefix + "weight_zero_point"],
                         state_dict.get(prefix + "bias"))
        self.granularity = "per-channel" if state_dict[prefix + "weight_scale"].dim() else \
            "per-tensor"

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.has_bias}, {self.granularity}, engine={self.engine}, "
                f"activations {self.activations}")


def _quantize_weight(weight: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                     engine: str) -> torch.Tensor:
    """``weight`` (fp32, or int8 values already rounded) as a qint8 tensor with ``scale``.
    torch's own rounding (round half to even, clamped to [-128, 127]) makes the int8 values
    those of torch.ao's observers; int8 values come back unchanged, except that values beyond
    64 are halved (scale doubled) where ``engine`` would saturate them on this CPU (a folder
    quantised on a VNNI host, run on an AVX2 one)."""
    if weight.dtype == torch.int8:
        if not full_range_exact(engine) and int(weight.abs().max()) > 64:
            weight, scale = torch.round(weight.float() / 2), scale * 2  # |q| <= 64
        weight = weight.float() * (scale.float().unsqueeze(1) if scale.dim() else float(scale))
    return _qint8(weight, scale, zero_point)


# -- the engine of each layer shape, measured on this host ----------------------------------------
def measure_int8_times(fan_in: int, fan_out: int, activations: str, tokens: int = AUTO_TOKENS,
                       reps: int = 7) -> dict[str, float]:
    """Seconds of one forward pass of a ``fan_in`` x ``fan_out`` layer on ``tokens`` rows: fp32
    and each int8 engine (per-channel weights, ``activations``). The paths take turns and each
    keeps its fastest pass: other work on the CPU slows a pass, never speeds it up."""
    torch.manual_seed(0)
    linear, x = nn.Linear(fan_in, fan_out), torch.randn(tokens, fan_in)
    engines = [e for e in CANDIDATES if e in int8_engines()] or int8_engines()
    layers = {"fp32": linear, **{e: Int8Linear.from_linear(linear, e, "per-channel", activations)
                                 for e in engines}}
    best = dict.fromkeys(layers, float("inf"))
    with torch.inference_mode():
        for rep in range(reps + 1):  # the first round warms up (packing, kernel choice)
            for name, layer in layers.items():
                start = time.perf_counter()
                layer(x)
                if rep:
                    best[name] = min(best[name], time.perf_counter() - start)
    return best


def int8_times(fan_in: int, fan_out: int, activations: str, tokens: int = AUTO_TOKENS,
               refresh: bool = False) -> dict[str, float]:
    """:func:`measure_int8_times` for this host, from the per-host cache of
    :func:`lmlab.cost.shapes.cached_seconds` or measured now (once)."""
    from lmlab.cost.shapes import cached_seconds

    return cached_seconds(f"int8 {activations}:{tokens}:{fan_in}x{fan_out}",
                          lambda: measure_int8_times(fan_in, fan_out, activations, tokens),
                          refresh)


def fastest_engine(fan_in: int, fan_out: int, activations: str = "per-token",
                   with_fp32: bool = False) -> str:
    """The int8 engine that ran this layer shape fastest on this host (or ``"fp32"`` where
    ``with_fp32`` and plain fp32 was faster than every engine)."""
    times = int8_times(fan_in, fan_out, activations)
    paths = [p for p in times if p in int8_engines() or (with_fp32 and p == "fp32")]
    return min(paths, key=times.__getitem__)


# -- checks ------------------------------------------------------------------------------------------
def quantizable_linears(model: nn.Module) -> list[str]:
    """Names of the layers :func:`quantize_int8` would convert, after refusing (LmlabError)
    what it cannot convert faithfully: a model already quantised, weights off the CPU or not
    fp32, a subclass of ``nn.Linear`` (a LoRA, masked or otherwise changed forward that a plain
    int8 product would silently drop), a linear layer carrying hooks or parametrisations
    (pruning masks), or a model without any linear layer."""
    from torch.nn.utils import parametrize

    if not isinstance(model, nn.Module):
        raise LmlabError(f"can only quantise a torch module, got {type(model).__name__}",
                         "pass a model loaded with lmlab.from_pretrained")
    if any(isinstance(m, Int8Linear) for m in model.modules()):
        raise LmlabError("the model is already int8-quantised",
                         "quantise the fp32 model (load the original checkpoint)")
    names, unsupported = [], []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        if type(module) is not nn.Linear:
            unsupported.append(f"{name} ({type(module).__module__}.{type(module).__name__}, a "
                               "subclass of nn.Linear with its own forward)")
        elif parametrize.is_parametrized(module) or module._forward_hooks or \
                module._forward_pre_hooks:
            unsupported.append(f"{name} (nn.Linear with hooks or parametrisations, e.g. a "
                               "pruning mask)")
        else:
            names.append(name)
    if unsupported:
        raise LmlabError(f"cannot quantise {len(unsupported)} layer(s) faithfully: "
                         + "; ".join(unsupported[:3]) + (" ..." if len(unsupported) > 3 else ""),
                         "merge adapters into their base weights and make pruning permanent "
                         "(torch.nn.utils.prune.remove) first, so that every linear layer is a "
                         "plain nn.Linear")
    if not names:
        raise LmlabError(f"{type(model).__name__} has no nn.Linear layer to quantise",
                         "int8 dynamic quantisation converts linear layers only; pass a "
                         "Transformer model")
    for name in names:
        weight = model.get_submodule(name).weight
        if weight.device.type != "cpu":
            raise LmlabError(f"layer {name} is on {weight.device}; int8 dynamic quantisation "
                             "runs on the CPU", "move the model to the CPU first: model.cpu()")
        if weight.dtype != torch.float32:
            raise LmlabError(f"layer {name} holds {weight.dtype} weights; quantisation starts "
                             "from fp32", "load the model in fp32 (no dtype=...) or call "
                             "model.float() first")
    return names


def check_options(engine: str, granularity: str, activations: str = "per-token") -> None:
    """Refuse an engine this torch lacks, or an unknown granularity or activation scheme."""
    from lmlab.utils.checks import check_choice

    check_choice(engine, [AUTO, *int8_engines()], "int8 engine", "int8 engine")
    check_choice(granularity, GRANULARITIES, "granularity", "granularity")
    check_choice(activations, ACTIVATIONS, "activation scheme", "activation scheme")


# -- quantise, save, load --------------------------------------------------------------------------
def quantize_int8(model: nn.Module, engine: str | None = AUTO, granularity: str = "per-channel",
                  activations: str = "per-token") -> nn.Module:
    """Replace the ``nn.Linear`` layers of ``model`` (in place) by :class:`Int8Linear`;
    returns the model, in eval mode.

    Args:
        engine: the int8 kernels ("x86", "onednn", "fbgemm") for every layer; ``"auto"`` (or
            None) = per layer shape, the fastest measured on this host (:func:`int8_times`,
            cached), a shape that runs faster in fp32 than in int8 staying fp32.
        granularity: one weight scale per output channel (the default: as fast, and closer
            to fp32, docs/compression-inference.md) or per tensor.
        activations: one input range per token (the default; MiniLM's sentence vectors stay
            within cosine 0.99 of fp32) or per call (faster, less exact).

    Example:
        >>> import lmlab
        >>> from lmlab.compress.quantize import quantize_int8
        >>> model = quantize_int8(lmlab.from_pretrained("minilm"))
    """
    engine = engine or AUTO
    check_options(engine, granularity, activations)
    names = quantizable_linears(model)  # every refusal before the first conversion
    engines = {name: engine for name in names}
    if engine == AUTO:
        engines = {name: fastest_engine(model.get_submodule(name).in_features,
                                        model.get_submodule(name).out_features, activations,
                                        with_fp32=True) for name in names}
        if all(e == "fp32" for e in engines.values()):
            raise LmlabError("on this host every linear layer of the model runs faster in fp32 "
                             "than in int8 (measured per layer shape): int8 would only lose "
                             "accuracy", "keep the fp32 model, or name an engine to quantise "
                             f"anyway ({', '.join(int8_engines())})")
    for name, chosen in engines.items():
        if chosen != "fp32":
            model.set_submodule(name, Int8Linear.from_linear(model.get_submodule(name), chosen,
                                                             granularity, activations))
    return model.eval()


def quantized_layers(model: nn.Module) -> list[str]:
    """Names of the :class:`Int8Linear` layers of ``model``."""
    return [name for name, m in model.named_modules() if isinstance(m, Int8Linear)]


def save_quantized(model: nn.Module, path: str | Path, tokenizer: Any = None,
                   overwrite: bool = False) -> Path:
    """Write a quantised :class:`~lmlab.models.model.LanguageModel` (or encoder-decoder) as a
    folder :func:`load_quantized` (and ``lmlab.from_pretrained``) reads in a new process:
    ``config.json`` (lmlab's own model format, :mod:`lmlab.interop.native`), ``model.safetensors``
    (int8 weights, their scales, and the fp32 rest), ``quantization.json`` (method, engine per
    layer, granularity, activation ranges, the converted layers) and the tokenizer's files when ``tokenizer`` is given.
    transformers cannot read it: int8 weights are not a Hugging Face format."""
    from lmlab.interop.native import save_native
    from lmlab.utils.checks import check_output_folder
    from lmlab.utils.io import atomic_write_json

    layers = quantized_layers(model)
    if not layers:
        raise LmlabError("the model has no int8 layer to save",
                         "quantise it first: lmlab.compress.quantize.quantize_int8(model)")
    if not hasattr(model, "config") or not hasattr(model, "heads"):
        raise LmlabError(f"cannot save a quantised {type(model).__name__}",
                         "quantise a model loaded with lmlab.from_pretrained")
    stray = _not_rebuilt(model, layers)
    if stray:
        raise LmlabError(f"the model has tensors that a model built from its config lacks "
                         f"({', '.join(stray[:3])}): the saved folder would not load",
                         "quantise the model without them (prompt or prefix tuning's virtual "
                         "tokens have no place in a quantised folder); this one works in memory")
    path = Path(path)
    check_output_folder(path, overwrite, "quantised model", ignore=(".*.tmp",))
    first = model.get_submodule(layers[0])
    engines = {name: model.get_submodule(name).engine for name in layers}
    atomic_write_json(path / QUANTIZATION_FILE, {  # first: a half-written folder is refused
        "method": METHOD, "format_version": FORMAT_VERSION,
        "engine": max(set(engines.values()), key=list(engines.values()).count),
        "engines": engines, "granularity": first.granularity, "layers": layers,
        "activation_ranges": first.activations,
        "weights": "int8, symmetric (zero point 0), scale = max|W| / 127.5, or / 64 where the "
                   "quantising CPU's kernels would saturate 8 bits (halved at load where the "
                   "running CPU's would)",
        "activations": f"uint8, quantised on every call, one range {first.activations.replace('-', ' ')}"})
    save_native(model, path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return path


def _not_rebuilt(model: nn.Module, layers: list[str]) -> list[str]:
    """The state-dict entries of ``model`` (outside its int8 layers) that :func:`load_quantized`
    would not find in the model it builds from the config and heads, or that it would miss."""
    from lmlab.models.classes import build_model

    def outside(keys: Any) -> set[str]:
        return {k for k in keys if not any(k.startswith(f"{layer}.") for layer in layers)}

    ours = outside(model.state_dict().keys())
    with torch.device("meta"):
        fresh = build_model(model.config, list(model.heads), ours)
    return sorted(ours ^ outside(fresh.state_dict().keys()))


def load_quantized(path: str | Path, engine: str | None = None, head: Any = None,
                   dtype: torch.dtype | None = None) -> nn.Module:
    """Load a folder written by :func:`save_quantized`, packing its int8 weights for ``engine``
    (None: each layer's saved engine where this torch has it, else the fastest measured here).
    Whether 8-bit weights saturate is this process's CPU's question (:func:`full_range_exact`).
    A folder without ``activation_ranges`` predates per-token ranges: per-tensor."""
    from lmlab.formats.safetensors_io import load_state
    from lmlab.interop.native import read_native_config
    from lmlab.models.classes import build_model
    from lmlab.utils.io import read_json

    path = Path(path)
    info = read_json(path / QUANTIZATION_FILE)
    if info.get("method") != METHOD or info.get("format_version") != FORMAT_VERSION:
        raise LmlabError(f"{path / QUANTIZATION_FILE} describes {info.get('method')!r} version "
                         f"{info.get('format_version')}, which this lmlab does not read",
                         "re-quantise the fp32 model with this version (lmlab quantize)")
    if dtype not in (None, torch.float32):
        raise LmlabError(f"a quantised model cannot be cast to {dtype}",
                         "load it without dtype=... (its int8 layers compute in fp32)")
    weights = path / "model.safetensors"
    if not weights.is_file():
        raise LmlabError(f"{path} has {QUANTIZATION_FILE} but no model.safetensors",
                         "copy the whole folder, or quantise the model again")
    config, heads = read_native_config(path)
    if head is not None and set([head] if isinstance(head, str) else head) - set(heads):
        raise LmlabError(f"a quantised model keeps the heads it was saved with ({heads}); "
                         f"{head!r} is not one of them",
                         "quantise a model that has that head")
    granularity = info.get("granularity", "per-tensor")
    activations = info.get("activation_ranges", "per-tensor")
    check_options(engine or AUTO, granularity, activations)
    state = load_state(weights)
    model = build_model(config, heads, state)
    for name in info["layers"]:  # the structure: int8 layers where the saved model had them
        linear = model.get_submodule(name)
        chosen = engine or info.get("engines", {}).get(name, info.get("engine"))
        if chosen not in int8_engines():
            chosen = fastest_engine(linear.in_features, linear.out_features, activations)
        model.set_submodule(name, Int8Linear(linear.in_features, linear.out_features, None,
                                             chosen, granularity, linear.bias is not None,
                                             activations))
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
        problem = f"missing {missing[:5]}, unexpected {unexpected[:5]}" \
            if missing or unexpected else ""
    except RuntimeError as error:  # a mis-shaped tensor (Int8Linear's or a plain one)
        problem = str(error).splitlines()[-1].strip()
    if problem:
        raise LmlabError(f"the weights in {weights} do not match its config.json and "
                         f"{QUANTIZATION_FILE}: {problem}",
                         "copy the whole folder, or quantise the model again")
    return model.eval()
