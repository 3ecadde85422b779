"""GGUF files (llama.cpp's format) as decoders: the config from the metadata, Q4_0/Q4_1/Q8_0
matrices kept in their blocks (block-quantised layers), other tensors dequantised straight into
the parameters, the query/key rows put back into rotate-half order
(docs/decoders.md). The container is read by :mod:`lmlab.formats.gguf`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from lmlab.formats.gguf import GGUFFile
from lmlab.models.config import TransformerConfig
from lmlab.models.families import KNOWN_FAMILIES, FamilySpec, expand_rules, get_family
from lmlab.utils.errors import LmlabError


def _family(metadata: dict[str, Any]) -> FamilySpec:
    """The family of ``general.architecture``, if its spec has GGUF names."""
    arch = metadata.get("general.architecture")
    readable = [name for name in KNOWN_FAMILIES if get_family(name).gguf_names]
    if arch not in readable:
        raise LmlabError(f"GGUF architecture {arch!r} is not supported",
                         f"lmlab reads GGUF files of: {', '.join(readable)}")
    return get_family(arch)


def config_from_gguf(metadata: dict[str, Any], tensor_names: set[str] | None = None
                     ) -> TransformerConfig:
    """A :class:`TransformerConfig` from GGUF metadata: ``<architecture>.*`` keys through the
    family's ``gguf_names``, token ids from the tokenizer's keys, biases and a tied output
    projection from which tensors the file holds."""
    spec = _family(metadata)
    arch = spec.model_type
    tensors = tensor_names or set()
    if "rope_freqs.weight" in tensors:  # per-frequency factors (Llama 3.1's converted)
        raise LmlabError("this GGUF scales RoPE by a rope_freqs tensor, which lmlab does not read "
                         "(Llama 3's rope_scaling cannot be recovered from it exactly)",
                         "load the model's Hugging Face folder (lmlab.from_pretrained) instead")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if tokens is not None:
        metadata = {f"{arch}.vocab_size": len(tokens), **metadata}
    values = spec.read(spec.gguf_names, metadata, "the GGUF metadata", prefix=f"{arch}.")
    values["rope_scaling"] = rope_scaling_from_gguf(metadata, arch)
    for name, key in (("pad", "padding"), ("bos", "bos"), ("eos", "eos")):
        values[f"{name}_token_id"] = metadata.get(f"tokenizer.ggml.{key}_token_id")
    values["tie_word_embeddings"] = tensor_names is not None and "output.weight" not in tensors
    values["attention_bias"] = bool({"blk.0.attn_q.bias", "blk.0.attn_qkv.bias"} & tensors)
    return TransformerConfig(**values)


#: llama.cpp's ``<arch>.rope.scaling.*`` keys lmlab maps -> rope_scaling keys (linear, yarn)
ROPE_SCALING_KEYS = {"factor": "factor",
                     "original_context_length": "original_max_position_embeddings",
                     "yarn_beta_fast": "beta_fast", "yarn_beta_slow": "beta_slow"}


def rope_scaling_from_gguf(metadata: dict[str, Any], arch: str) -> dict[str, Any] | None:
    """``rope_scaling`` from llama.cpp's RoPE scaling keys (none, linear or YaRN); keys that
    would change the model in ways transformers' types cannot say are refused."""
    prefix = f"{arch}.rope.scaling."
    kind = metadata.get(prefix + "type") or "none"
    given = {k.removeprefix(prefix): v for k, v in metadata.items() if k.startswith(prefix)}
    odd = sorted(k for k, v in given.items() if k not in {"type", "finetuned", *ROPE_SCALING_KEYS}
                 and not (k == "attn_factor" and v == 1.0))
    if kind not in ("none", "linear", "yarn") or odd:
        raise LmlabError(f"this GGUF's RoPE scaling ({kind}{', ' if odd else ''}"
                         f"{', '.join(odd)}) has no transformers rope type lmlab implements",
                         "lmlab reads GGUF RoPE scaling of type none, linear and yarn")
    if kind == "none" or (kind == "linear" and given.get("factor", 1.0) == 1.0):
        return None
    return {"rope_type": kind, **{ROPE_SCALING_KEYS[k]: v for k, v in given.items()
                                  if k in ROPE_SCALING_KEYS and (kind == "yarn" or k == "factor")}}


def rope_scaling_to_gguf(config: TransformerConfig) -> dict[str, Any]:
    """llama.cpp's ``<arch>.rope.scaling.*`` metadata of ``config.rope_scaling``; refused where
    llama.cpp has no key for it (dynamic NTK, Llama 3's, YaRN's attention factor or mscale)."""
    if config.rope_scaling is None:
        return {}
    scaling = dict(config.rope_scaling)
    kind = scaling.pop("rope_type")
    theirs = {ours: key for key, ours in ROPE_SCALING_KEYS.items()}
    odd = sorted(k for k in scaling if k not in theirs and not (k == "truncate" and scaling[k]))
    if kind not in ("linear", "yarn") or odd or scaling["factor"] is None:
        raise LmlabError(f"RoPE scaling {kind!r}{' with ' if odd else ''}{', '.join(odd)} has "
                         "no GGUF keys (llama.cpp: linear, yarn without attention factors)",
                         "export it with save_pretrained (Hugging Face folder) instead")
    prefix = f"{config.family}.rope.scaling."
    return {prefix + "type": kind, **{  # llama.cpp's types: a uint32 length, float32 others
        prefix + theirs[k]: int(v) if k.startswith("original") else float(v)
        for k, v in scaling.items() if k in theirs}}


def gguf_tensor_names(config: TransformerConfig) -> dict[str, str | tuple[str, ...]]:
    """GGUF tensor name -> lmlab parameter name (the LM head's unless tied); a tuple of names
    for a fused tensor (GPT-2's ``attn_qkv``: q, k, v rows concatenated)."""
    spec = get_family(config.family)
    rules = spec.base_rules(config) + spec.head_rules["clm"](config)
    return {rule.gguf: rule.ours for rule in expand_rules(rules, config.num_hidden_layers)
            if rule.gguf and not rule.optional}


def rotary_paired(gguf_name: str) -> bool:
    """Whether llama.cpp stores this tensor's rows for adjacent-pair rotation (query, key)."""
    return ".attn_q." in gguf_name or ".attn_k." in gguf_name


def uninitialised_model(config: TransformerConfig):
    """A ``"clm"`` :class:`~lmlab.models.model.LanguageModel` whose parameters are left
    uninitialised, for a loader that overwrites every one (random init takes seconds; the meta
    device imports torch._dynamo, as slow). Buffers are computed as usual."""
    from torch.overrides import TorchFunctionMode

    from lmlab.models.model import LanguageModel

    class SkipRandomInit(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if getattr(func, "__name__", "") in ("normal_", "uniform_", "kaiming_uniform_"):
                return (*args, *kwargs.values())[0]  # the tensor, unchanged
            return func(*args, **kwargs)

    with SkipRandomInit():
        return LanguageModel(config, heads=("clm",))


#: ggml block types the quantised layers compute from: bytes per block of 32, code offset
QUANTISED_TYPES = {"Q4_0": (18, 2), "Q4_1": (20, 4), "Q8_0": (34, 2)}


def block_codes(file: GGUFFile, name: str, rows: np.ndarray | slice = slice(None)
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
    """(codes, scales, minima) of a Q4_0/Q4_1/Q8_0 tensor's ``rows`` in
    :class:`~lmlab.models.quantised.BlockQuantLinear`'s terms (float16 scales as stored, Q4_0's
    ``d * (q - 8)`` as the float32 minimum ``-8 d``); None for another type."""
    data, info = file.raw(name)
    if info.type_name not in QUANTISED_TYPES or len(info.shape) != 2:
        return None
    size, start = QUANTISED_TYPES[info.type_name]
    blocks = data.reshape(info.shape[0], -1, size)[rows]  # (N, K / 32, bytes per block)
    scales = blocks[..., :2].copy().view(np.float16)[..., 0]  # (N, K / 32)
    if info.type_name == "Q8_0":
        return blocks[..., start:].view(np.int8), scales, None
    mins = (blocks[..., 2:4].copy().view(np.float16)[..., 0] if info.type_name == "Q4_1"
            else -8 * scales.astype(np.float32))
    return blocks[..., start:], scales, mins


def _swap_quantised(file: GGUFFile, model, theirs: str, ours: str | tuple[str, ...],
                    config: TransformerConfig) -> bool:
    """Put a :class:`~lmlab.models.quantised.BlockQuantLinear` over tensor ``theirs``'s codes
    in place of the linear map (or token table, and its tied projection) it fills; False, and
    nothing changed, when it is not a block-quantised matrix of a linear map or table."""
    from lmlab.models.quantised import BlockQuantEmbedding, BlockQuantLinear

    targets = (ours,) if isinstance(ours, str) else ours
    if file.tensors[theirs].type_name not in QUANTISED_TYPES \
            or not all(t.endswith(".weight") for t in targets):
        return False
    modules = [model.get_submodule(t.removesuffix(".weight")) for t in targets]
    if not all(isinstance(m, (nn.Linear, nn.Embedding)) for m in modules):
        return False
    order = None
    if rotary_paired(theirs):  # llama.cpp's adjacent pairs -> rotate-half order
        heads = file.tensors[theirs].shape[0] // config.head_dim
        order = np.arange(heads * config.head_dim).reshape(heads, -1, 2).swapaxes(1, 2)
    sizes = [m.weight.shape[0] for m in modules]
    for module, target, first, count in zip(modules, targets, np.cumsum([0] + sizes), sizes):
        rows = slice(first, first + count) if order is None else order.reshape(-1)
        linear = BlockQuantLinear(*block_codes(file, theirs, rows),
                                  bias=getattr(module, "bias", None))
        parent, child = target.removesuffix(".weight").rsplit(".", 1)
        if isinstance(module, nn.Embedding):
            tied = config.tie_word_embeddings and module is model.get_input_embeddings()
            setattr(model.get_submodule(parent), child,
                    BlockQuantEmbedding(linear, module.padding_idx))
            if tied:
                for head in model.heads.values():
                    if getattr(head, "decoder", None) is not None:
                        head.decoder = linear
        else:
            setattr(model.get_submodule(parent), child, linear)
    file.release(theirs)
    return True


def load_gguf_model(path: str | Path, dtype: Any = None, dequantize: bool = False):
    """A ``"clm"`` :class:`~lmlab.models.model.LanguageModel` from a GGUF file, its chat
    template kept as ``model.chat_template``. Q4_0/Q4_1/Q8_0 matrices stay in their blocks and
    run as :class:`~lmlab.models.quantised.BlockQuantLinear`; ``dequantize=True`` loads every
    tensor as float32 instead (the reference path). Copies are numpy's: torch's parallel copies
    stall on a busy 2-core host."""
    from lmlab.utils.progress import progress

    with GGUFFile(path) as file:
        config = config_from_gguf(file.metadata, set(file.tensors))
        model = uninitialised_model(config)
        names = gguf_tensor_names(config)
        missing = [n for n in names if n not in file.tensors]
        unexpected = sorted(set(file.tensors) - set(names))
        if missing or unexpected:
            raise LmlabError(
                f"{file.path} does not hold the tensors a {config.family} model needs "
                f"(missing: {missing[:8]}, unexpected: {unexpected[:8]})",
                f"use a GGUF converted from a {config.family}-architecture model")
        params = dict(model.named_parameters())
        _check_shapes(file, names, params)
        for theirs, ours in progress(names.items(), desc=f"loading {file.path.name}",
                                     total=len(names), unit="tensor"):
            if not dequantize and _swap_quantised(file, model, theirs, ours, config):
                continue
            _load_float(file, theirs, [params[name].detach().numpy() for name in (
                (ours,) if isinstance(ours, str) else ours)], config)
        model.chat_template = file.metadata.get("tokenizer.chat_template")
    if not dequantize:
        from lmlab.models.quantised import load_kernels

        load_kernels()  # numba and the compiled kernels now, not at the first token
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()


def _check_shapes(file: GGUFFile, names: dict, params: dict) -> None:
    """Refuse a tensor whose shape is not the one the metadata implies, before any work."""
    for theirs, ours in names.items():
        parts = [params[name] for name in ((ours,) if isinstance(ours, str) else ours)]
        expected = (sum(p.shape[0] for p in parts), *parts[0].shape[1:])
        if expected != file.tensors[theirs].shape:
            raise LmlabError(f"{theirs} has shape {file.tensors[theirs].shape} but the "
                             f"metadata implies {expected}",
                             "the file's metadata and tensors disagree; re-convert it")


def _load_float(file: GGUFFile, theirs: str, parts: list[np.ndarray],
                config: TransformerConfig) -> None:
    """Tensor ``theirs`` dequantised to float32 into ``parts`` (a parameter, or the q, k, v
    parameters of a fused tensor), query/key rows in rotate-half order."""
    target = parts[0]
    if len(parts) > 1:  # fused (GPT-2's attn_qkv): split the rows
        values = file.tensor(theirs)
        for part, start in zip(parts, np.cumsum([0] + [len(p) for p in parts])):
            part[...] = values[start:start + len(part)]
    elif rotary_paired(theirs):  # rotary_rows_from_pairs, in numpy
        values, heads = file.tensor(theirs), len(target) // config.head_dim
        pairs = values.reshape(heads, -1, 2, *values.shape[1:])  # (nh, hd/2, 2, ...)
        target.reshape(heads, 2, -1, *values.shape[1:])[...] = pairs.swapaxes(1, 2)
    else:
        file.tensor_into(theirs, target)
    file.release(theirs)
