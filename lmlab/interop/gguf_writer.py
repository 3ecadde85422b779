"""Writing Llama-style and GPT-2 decoders as self-contained GGUF files (sizes, tokenizer,
weights under llama.cpp's names), the inverse of :mod:`lmlab.interop.gguf`, with the reader's
tables. Weight types and what each costs: docs/decoders.md.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from lmlab.interop.gguf import gguf_tensor_names, rope_scaling_to_gguf, rotary_paired
from lmlab.models.families import get_family
from lmlab.tokenization.gguf import PRE_TOKENIZER_SPLITS
from lmlab.utils.errors import LmlabError

#: The weight types :func:`write_gguf` writes, with llama.cpp's ``general.file_type`` of each.
GGUF_TYPES = {"F32": 0, "F16": 1, "Q8_0": 7, "Q4_0": 2}
#: Families lmlab writes: those whose spec names GGUF tensors, less what their GGUF cannot say.
WRITABLE_FAMILIES = ("llama", "gpt2")
#: Settings each family's GGUF graph fixes (transformers' GGUF loader builds Llama without
#: attention biases).
FIXED_SETTINGS = {
    "llama": (("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False)),
    "gpt2": (("hidden_act", "gelu_new"),),
}
QUANTIZATION_VERSION = 2  # ggml's block layout version (llama.cpp's GGML_QUANT_VERSION)
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5  # llama.cpp's token types


def check_writable_family(family: str | None) -> None:
    """Refuse a family lmlab cannot write as GGUF (the CLI asks before loading any weights)."""
    if family not in WRITABLE_FAMILIES:
        raise LmlabError(f"lmlab does not write GGUF files of {family or 'this kind of'} models",
                         f"GGUF export supports the families: {', '.join(WRITABLE_FAMILIES)}; "
                         "save other models with save_pretrained (Hugging Face folder)")


def _check_model(model: Any) -> None:
    """Refuse a model whose tensors are not those the GGUF reader builds from the metadata
    (another family, pruned heads, low-rank factors, settings the format has no key for)."""
    import torch

    from lmlab.models.model import LanguageModel

    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False) or not hasattr(model, "transformer"):
        check_writable_family(None)
    check_writable_family(config.family)
    spec = get_family(config.family)
    wrong = [f"{name}={getattr(config, name)!r}" for name, value in spec.shape.items()
             if getattr(config, name) != value]
    # What a GGUF cannot say (FIXED_SETTINGS, and settings no GGUF key describes): refused
    # rather than lost (transformers' GGUF loader would drop Llama's attention biases silently).
    wrong += [f"{name}={getattr(config, name)!r}" for name, value in (
        *FIXED_SETTINGS[config.family], ("attention_scale", None), ("scale_embedding", False),
        ("embedding_size", None), ("share_layers", False)) if getattr(config, name) != value]
    if "head_dim" not in spec.gguf_names.values() \
            and config.head_dim * config.num_attention_heads != config.hidden_size:
        # no key_length in its GGUF (gpt2): readers take hidden / heads (uniformly pruned heads)
        wrong.append(f"head_dim={config.head_dim} with {config.num_attention_heads} heads of "
                     f"hidden size {config.hidden_size}")
    if wrong:
        raise LmlabError(f"this {config.family} model has settings a GGUF file cannot describe: "
                         f"{', '.join(wrong)}",
                         "export it with save_pretrained (Hugging Face folder) instead")
    if "clm" not in model.heads and not config.tie_word_embeddings:
        raise LmlabError("the model has no language-model head ('clm') and its output is not "
                         "tied to the embeddings",
                         "load it with head='clm' (lmlab.from_pretrained(path, head='clm'))")
    with torch.device("meta"):  # what the reader builds from the file's metadata
        plain = LanguageModel(replace(config, extra={}), heads=("clm",))
    expected = {name: tuple(p.shape) for name, p in plain.named_parameters()}
    have = {name: tuple(p.shape) for name, p in model.named_parameters()}
    names = {n for ours in gguf_tensor_names(config).values()
             for n in ((ours,) if isinstance(ours, str) else ours)}
    odd = sorted(name for name in have.keys() | names if not name.startswith("heads.")
                 and have.get(name) != expected.get(name))
    if odd:
        raise LmlabError(f"the model's weights are not those of a plain {config.family} of its "
                         f"config (e.g. {odd[0]}: {have.get(odd[0])} vs "
                         f"{expected.get(odd[0])}); pruned heads or low-rank factors have no "
                         "GGUF layout",
                         "export it with save_pretrained (Hugging Face folder) instead")


def _pre_tokenizer_name(tokenizer: Any, state: dict[str, Any]) -> str:
    """llama.cpp's ``tokenizer.ggml.pre``: the name a GGUF tokenizer was read with, else the
    one that describes the same split."""
    kept = getattr(tokenizer, "gguf_pre", None)
    if kept:
        return kept
    pre = state.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    kinds = [p.get("type") for p in parts]
    last = parts[-1] if parts else {}
    if kinds and kinds[-1] == "ByteLevel" and not last.get("add_prefix_space"):
        if kinds == ["ByteLevel"] and last.get("use_regex", True):
            return "gpt-2"
        if kinds == ["Digits", "ByteLevel"] and parts[0].get("individual_digits") \
                and last.get("use_regex", True):
            return "smollm"  # SmolLM's tokenizer.json: digits one by one, then GPT-2's split
        if kinds == ["Split", "ByteLevel"] and not last.get("use_regex", True):
            regex = (parts[0].get("pattern") or {}).get("Regex")
            for name, split in PRE_TOKENIZER_SPLITS.items():
                if split == regex:
                    return name
    raise LmlabError(f"the tokenizer's pre-tokenizer ({json.dumps(pre)[:200]}) has no name "
                     "in llama.cpp",
                     "GGUF export writes byte-level BPE tokenizers that split text as GPT-2, "
                     "SmolLM, Llama 3 or Qwen2 do")


def tokenizer_metadata(tokenizer: Any, vocab_size: int) -> dict[str, Any]:
    """The ``tokenizer.*`` GGUF metadata of a byte-level BPE :class:`lmlab.Tokenizer` for
    ``vocab_size`` embedding rows (the rows past it get llama.cpp's ``[PAD<i>]`` tokens).
    Refused: other tokenizer models, a normaliser, a template adding more than BOS/EOS."""
    if tokenizer is None:
        raise LmlabError("no tokenizer given; a GGUF file carries its tokenizer",
                         "pass the model's tokenizer (lmlab.Tokenizer.from_pretrained(path))")
    engine = tokenizer.backend_tokenizer
    state = json.loads(engine.to_str())
    model = state.get("model") or {}
    decoder = state.get("decoder") or {}
    if model.get("type") != "BPE" or decoder.get("type") != "ByteLevel" \
            or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix") \
            or model.get("byte_fallback"):
        raise LmlabError(f"the tokenizer is {model.get('type')} with a "
                         f"{decoder.get('type')} decoder, not byte-level BPE",
                         "GGUF export writes byte-level BPE tokenizers (GPT-2, SmolLM2, Llama 3, "
                         "Qwen2 style: tokenizer.ggml.model = gpt2)")
    if state.get("normalizer"):
        raise LmlabError(f"the tokenizer has a normaliser ({state['normalizer'].get('type')}), "
                         "which a GGUF file cannot describe",
                         "use a byte-level BPE tokenizer without a normaliser")
    pre = _pre_tokenizer_name(tokenizer, state)
    count = len(tokenizer)
    if count > vocab_size:
        raise LmlabError(f"the tokenizer has {count} tokens but the model has {vocab_size} "
                         "embedding rows", "pass the tokenizer saved with this model")
    added = engine.get_added_tokens_decoder()
    tokens, types = [], []
    for index in range(vocab_size):
        token = engine.id_to_token(index) if index < count else None
        if token is None:
            tokens.append(f"[PAD{index}]")
            types.append(UNUSED)
        else:
            tokens.append(token)
            types.append(NORMAL if index not in added else
                         CONTROL if added[index].special else USER_DEFINED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    ids = {"bos": tokenizer.bos_token_id, "eos": tokenizer.eos_token_id,
           "unknown": tokenizer.unk_token_id, "padding": tokenizer.pad_token_id}
    plain = engine.encode("a b", add_special_tokens=False).ids
    full = engine.encode("a b", add_special_tokens=True).ids
    add_bos = ids["bos"] is not None and full[:1] == [ids["bos"]] and full[1:1 + len(plain)] == plain
    start = 1 if add_bos else 0
    add_eos = ids["eos"] is not None and full[start + len(plain):] == [ids["eos"]]
    if full != [ids["bos"]] * add_bos + plain + [ids["eos"]] * add_eos:
        raise LmlabError("the tokenizer's template adds tokens other than BOS and EOS "
                         f"({full} for the text 'a b'), which a GGUF file cannot describe",
                         "use a decoder tokenizer whose template adds at most BOS and EOS")
    metadata: dict[str, Any] = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
                                "tokenizer.ggml.tokens": tokens,
                                "tokenizer.ggml.token_type": types,
                                "tokenizer.ggml.merges": merges}
    metadata.update({f"tokenizer.ggml.{key}_token_id": value for key, value in ids.items()
                     if value is not None})
    metadata["tokenizer.ggml.add_bos_token"] = add_bos
    metadata["tokenizer.ggml.add_eos_token"] = add_eos
    if getattr(tokenizer, "chat_template", None):
        metadata["tokenizer.chat_template"] = tokenizer.chat_template
    return metadata


def model_metadata(config: Any) -> dict[str, Any]:
    """The ``<architecture>.*`` GGUF metadata of ``config`` (the reader's ``gguf_names``
    backwards), each value in its field's type: llama.cpp refuses an integer freq_base."""
    from dataclasses import fields

    spec = get_family(config.family)
    floats = {f.name for f in fields(config) if "float" in str(f.type)}
    return {**{f"{spec.model_type}.{key}": float(getattr(config, name)) if name in floats
               else getattr(config, name) for key, name in spec.gguf_names.items()},
            **rope_scaling_to_gguf(config)}


def _tensor_type(shape: tuple[int, ...], qtype: str) -> str:
    """1-D tensors in F32, matrices in ``qtype`` (F16 where rows are not whole blocks)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    if len(shape) < 2 or qtype == "F32":
        return "F32"
    if qtype == "F16":
        return "F16"
    block = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]][0]
    return qtype if shape[-1] % block == 0 else "F16"


def _add_metadata(writer: Any, key: str, value: Any) -> None:
    """One key in llama.cpp's value types (uint32 counts, float32 reals, arrays)."""
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    else:
        writer.add_array(key, list(value))


def write_gguf(model: Any, path: str | Path, tokenizer: Any, qtype: str = "F16", *,
               overwrite: bool = False, name: str | None = None,
               show_progress: bool = True) -> Path:
    """Write a Llama-style or GPT-2 ``model`` with its byte-level BPE ``tokenizer`` as one GGUF
    file (atomically) that llama.cpp, :func:`lmlab.interop.gguf.load_gguf_model` and
    transformers read; ``qtype``: F32, F16, Q8_0 or Q4_0; ``name``: ``general.name`` (default:
    the file's stem). Everything is checked before any tensor is converted."""
    from lmlab.models.quantised import dequantized
    from lmlab.utils.checks import check_choice, check_output_file

    qtype = check_choice(str(qtype).upper(), GGUF_TYPES, "qtype", "GGUF type")
    path = check_output_file(path, overwrite, "output")
    model = dequantized(model)  # a GGUF read with its blocks kept: re-quantised from float32
    _check_model(model)
    config = model.config
    metadata = model_metadata(config)
    metadata.update(tokenizer_metadata(tokenizer, config.vocab_size))
    template = metadata.get("tokenizer.chat_template") or getattr(model, "chat_template", None)
    if template:
        metadata["tokenizer.chat_template"] = template

    import gguf
    import torch

    from lmlab.models.core.positions import rotary_rows_to_pairs
    from lmlab.utils.io import atomic_path
    from lmlab.utils.progress import progress

    params = dict(model.named_parameters())
    names = gguf_tensor_names(config)  # tied: no output.weight (the reader ties it back)
    with atomic_path(path) as tmp, contextlib.closing(gguf.GGUFWriter(str(tmp), config.family)
                                                     ) as writer:
        writer.add_name(name or path.stem)
        writer.add_file_type(GGUF_TYPES[qtype])
        writer.add_quantization_version(QUANTIZATION_VERSION)
        for key, value in metadata.items():
            _add_metadata(writer, key, value)
        items = names.items()
        if show_progress:
            items = progress(items, desc=f"GGUF {qtype}", total=len(names), unit="tensor")
        for theirs, ours in items:
            with torch.no_grad():
                parts = (ours,) if isinstance(ours, str) else ours  # GPT-2's attn_qkv: q; k; v
                value = torch.cat([params[n].detach().to(device="cpu", dtype=torch.float32)
                                   for n in parts])
                if rotary_paired(theirs):
                    value = rotary_rows_to_pairs(value, config.head_dim)
            array = np.ascontiguousarray(value.numpy())
            kind = gguf.GGMLQuantizationType[_tensor_type(array.shape, qtype)]
            data = gguf.quants.quantize(array, kind)
            writer.add_tensor(theirs, data, raw_shape=data.shape, raw_dtype=kind)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    return path
