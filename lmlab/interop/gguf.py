"""GGUF files (llama.cpp's format) as decoders: the config from the metadata, the tensors
dequantised straight into the parameters, the query/key rows put back into rotate-half order
(docs/decoders.md). The container is read by :mod:`lmlab.formats.gguf`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

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


def load_gguf_model(path: str | Path, dtype: Any = None):
    """A ``"clm"`` :class:`~lmlab.models.model.LanguageModel` from a GGUF file, its chat
    template kept as ``model.chat_template``. Copies are numpy's: torch's parallel copies stall
    on a busy 2-core host (2.4 s instead of 0.02 s for the query/key rows)."""
    from lmlab.utils.progress import progress

    with GGUFFile(path) as file:
        config = config_from_gguf(file.metadata, set(file.tensors))
        model = uninitialised_model(config)
        params = dict(model.named_parameters())
        names = gguf_tensor_names(config)
        missing = [n for n in names if n not in file.tensors]
        unexpected = sorted(set(file.tensors) - set(names))
        if missing or unexpected:
            raise LmlabError(
                f"{file.path} does not hold the tensors a {config.family} model needs "
                f"(missing: {missing[:8]}, unexpected: {unexpected[:8]})",
                f"use a GGUF converted from a {config.family}-architecture model")
        for theirs, ours in progress(names.items(), desc=f"loading {file.path.name}",
                                     total=len(names), unit="tensor"):
            parts = [params[name].detach().numpy()
                     for name in ((ours,) if isinstance(ours, str) else ours)]
            expected = (sum(p.shape[0] for p in parts), *parts[0].shape[1:])
            if expected != file.tensors[theirs].shape:
                raise LmlabError(f"{theirs} has shape {file.tensors[theirs].shape} but the "
                                 f"metadata implies {expected}",
                                 "the file's metadata and tensors disagree; re-convert it")
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
        model.chat_template = file.metadata.get("tokenizer.chat_template")
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()
