"""Post-training dynamic int8 quantisation of the linear layers, for CPU inference.

Every plain ``nn.Linear`` becomes an :class:`Int8Linear` (int8 weight with a symmetric scale per
tensor or per output channel; each input quantised on the fly; int8 products with int32
accumulation, rescaled to fp32), calling ATen's int8 GEMMs (fbgemm or oneDNN) directly with the
engine chosen per layer at run time. Q8BERT's scheme without its quantisation-aware training;
why these kernels rather than torch.ao or torchao, and the measured speed and error per engine:
docs/compression-inference.md.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmlab.interop.folders import QUANTIZATION_FILE
from lmlab.utils.errors import LmlabError

GRANULARITIES = ("per-tensor", "per-channel")
FORMAT_VERSION = 1
METHOD = "int8-dynamic"


def default_engine() -> str:
    """The int8 engine lmlab uses unless told otherwise: oneDNN where the CPU has AMX tiles (its
    int8 GEMM uses AMX-INT8; measured faster than x86 there, docs/compression-inference.md),
    else x86 (fbgemm's kernels)."""
    engines = torch.backends.quantized.supported_engines
    if "onednn" in engines and torch.cpu._is_amx_tile_supported():
        return "onednn"
    return "x86" if "x86" in engines else "fbgemm"


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


@functools.cache
def full_range_exact(engine: str) -> bool:
    """Whether ``engine``'s int8 products are exact, in this process, with 8-bit activations
    (the full uint8 range); where not, :class:`Int8Linear` quantises them to 7 bits.

    Without VNNI, pairs of uint8 x int8 products are added in 16 bits and saturate; rather than
    parse CPU flags and ``ONEDNN_MAX_CPU_ISA``, one product whose every pair overflows 16 bits
    asks the kernel, once per process and engine (docs/compression-inference.md). x86 and
    fbgemm keep torch's 7 bits."""
    if engine != "onednn":
        return False
    weight = torch.quantize_per_tensor(torch.full((8, 64), 127.0), 1.0, 0, torch.qint8)
    x = torch.full((2, 64), 255.0)
    x[:, 0] = 0  # range [0, 255]: scale 1, zero point 0, so the int32 sums come back as they are
    with quantized_engine(engine):
        y = torch.ops.quantized.linear_dynamic(x, torch.ops.quantized.linear_prepack(weight, None),
                                               False)
    return torch.equal(y, x @ weight.dequantize().T)


class Int8Linear(nn.Module):
    """A linear layer with int8 weights and dynamically quantised int8 activations.

    Its state dict holds plain tensors: ``weight_int8`` (out, in) int8, ``weight_scale`` (a
    scalar, or (out,) per channel; float64 as the kernels keep it), ``weight_zero_point``
    (zeros: the weights are symmetric) and ``bias`` (fp32, when the layer has one). Loading
    them packs the weight for this host's kernels. The activations' bits are not part of it:
    see :attr:`reduce_range`.
    """

    def __init__(self, in_features: int, out_features: int, packed: Any, engine: str,
                 granularity: str, has_bias: bool):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.engine, self.granularity, self.has_bias = engine, granularity, has_bias
        self._packed = packed

    @property
    def reduce_range(self) -> bool:
        """7-bit activations, unless the engine's kernels are exact with 8 on the CPU running
        this call (:func:`full_range_exact`): a model quantised on an AMX host is right here."""
        return not full_range_exact(self.engine)

    @classmethod
    def from_linear(cls, linear: nn.Linear, engine: str | None = None,
                    granularity: str = "per-tensor") -> Int8Linear:
        """Quantise ``linear``'s weight: symmetric, scale = max|W| / 127.5 (per tensor or per
        output row), the convention of torch's MinMaxObserver for qint8."""
        weight = linear.weight.detach().float()
        if granularity == "per-channel":
            amax = weight.abs().amax(dim=1)  # (out,)
        else:
            amax = weight.abs().amax()
        scale = (amax / 127.5).clamp(min=torch.finfo(torch.float32).eps).double()
        zero_point = torch.zeros_like(scale, dtype=torch.int64)
        bias = linear.bias.detach().float() if linear.bias is not None else None
        engine = engine or default_engine()
        return cls(linear.in_features, linear.out_features,
                   _pack(weight, scale, zero_point, bias, engine), engine, granularity,
                   bias is not None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The kernels take fp32 only; under bf16 autocast (--precision bf16) the attention
        # products hand over bf16, which fp32 holds exactly: the output keeps the input's dtype.
        dtype = x.dtype
        with quantized_engine(self.engine):
            y = torch.ops.quantized.linear_dynamic(x.float(), self._packed, self.reduce_range)
        return y if dtype == torch.float32 else y.to(dtype)

    def int8_state(self) -> dict[str, torch.Tensor]:
        """The weight as int8 values, scale(s) and zero point(s), and the fp32 bias."""
        with quantized_engine(self.engine):
            qweight, bias = torch.ops.quantized.linear_unpack(self._packed)
        if qweight.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
            scale = qweight.q_per_channel_scales().double()
            zero_point = qweight.q_per_channel_zero_points().long()
        else:
            scale = torch.tensor(qweight.q_scale(), dtype=torch.float64)
            zero_point = torch.tensor(qweight.q_zero_point(), dtype=torch.int64)
        state = {"weight_int8": qweight.int_repr(), "weight_scale": scale,
                 "weight_zero_point": zero_point}
        if bias is not None:
            state["bias"] = bias.float()
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
        self._packed = _pack(weight, state_dict[prefix + "weight_scale"],
                             state_dict[prefix + "weight_zero_point"],
                             state_dict.get(prefix + "bias"), self.engine)
        self.granularity = "per-channel" if state_dict[prefix + "weight_scale"].dim() else \
            "per-tensor"

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.has_bias}, {self.granularity}, engine={self.engine}, "
                f"{7 if self.reduce_range else 8}-bit activations")


def _pack(weight: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
          bias: torch.Tensor | None, engine: str) -> Any:
    """Round ``weight`` (fp32, or int8 values already rounded) to int8 with ``scale`` and pack
    it for ``engine``. torch's own rounding (round half to even, clamped to [-128, 127]) makes
    the int8 values those of torch.ao's observers; int8 values come back unchanged."""
    values = weight.float() * (scale.float().unsqueeze(1) if scale.dim() else float(scale)) \
        if weight.dtype == torch.int8 else weight.float()
    if scale.dim():
        qweight = torch.quantize_per_channel(values, scale.double(), zero_point.long(), 0,
                                             torch.qint8)
    else:
        qweight = torch.quantize_per_tensor(values, float(scale), int(zero_point), torch.qint8)
    with quantized_engine(engine):
        return torch.ops.quantized.linear_prepack(qweight, bias)


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


def check_options(engine: str, granularity: str) -> None:
    engines = [e for e in torch.backends.quantized.supported_engines if e != "none"]
    if engine not in engines:
        raise LmlabError(f"int8 engine {engine!r} is not available in this torch build",
                         f"use one of {', '.join(engines)} (or leave it out: {default_engine()})")
    if granularity not in GRANULARITIES:
        raise LmlabError(f"unknown granularity {granularity!r}",
                         f"use one of {', '.join(GRANULARITIES)}")


# -- quantise, save, load --------------------------------------------------------------------------
def quantize_int8(model: nn.Module, engine: str | None = None,
                  granularity: str = "per-channel") -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` (in place) by an :class:`Int8Linear`; returns
    the model, in eval mode.

    Args:
        engine: the int8 kernels ("x86", "onednn", "fbgemm"); None = :func:`default_engine`.
        granularity: one weight scale per output channel (the default: as fast, and closer
            to fp32, docs/compression-inference.md) or per tensor.

    Example:
        >>> import lmlab
        >>> from lmlab.compress.quantize import quantize_int8
        >>> model = quantize_int8(lmlab.from_pretrained("minilm"))
    """
    engine = engine or default_engine()
    check_options(engine, granularity)
    names = quantizable_linears(model)  # every refusal before the first conversion
    for name in names:
        model.set_submodule(name, Int8Linear.from_linear(model.get_submodule(name), engine,
                                                         granularity))
    return model.eval()


def quantized_layers(model: nn.Module) -> list[str]:
    """Names of the :class:`Int8Linear` layers of ``model``."""
    return [name for name, m in model.named_modules() if isinstance(m, Int8Linear)]


def save_quantized(model: nn.Module, path: str | Path, tokenizer: Any = None,
                   overwrite: bool = False) -> Path:
    """Write a quantised :class:`~lmlab.models.model.LanguageModel` (or encoder-decoder) as a
    folder :func:`load_quantized` (and ``lmlab.from_pretrained``) reads in a new process:
    ``config.json`` (lmlab's own model format, :mod:`lmlab.interop.native`), ``model.safetensors``
    (int8 weights, their scales, and the fp32 rest), ``quantization.json`` (method, engine,
    granularity, the converted layers) and the tokenizer's files when ``tokenizer`` is given.
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
    atomic_write_json(path / QUANTIZATION_FILE, {  # first: a half-written folder is refused
        "method": METHOD, "format_version": FORMAT_VERSION, "engine": first.engine,
        "granularity": first.granularity, "layers": layers,
        "weights": "int8, symmetric (zero point 0), scale = max|W| / 127.5",
        "activations": "uint8, per-tensor range computed per call; 8 bits where the running "
                       "CPU's kernels are exact with them (oneDNN on VNNI/AMX), else 7"})
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
    (None: the saved engine where this torch has it, else :func:`default_engine`). The folder
    holds no activation width: this process's CPU decides it (:func:`full_range_exact`)."""
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
    saved_engine = info.get("engine")
    if engine is None:
        engine = saved_engine if saved_engine in torch.backends.quantized.supported_engines \
            else default_engine()
    check_options(engine, info.get("granularity", "per-tensor"))
    state = load_state(weights)
    model = build_model(config, heads, state)
    for name in info["layers"]:  # the structure: int8 layers where the saved model had them
        linear = model.get_submodule(name)
        model.set_submodule(name, Int8Linear(linear.in_features, linear.out_features, None,
                                             engine, info.get("granularity", "per-tensor"),
                                             linear.bias is not None))
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
