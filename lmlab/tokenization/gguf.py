"""The tokenizer embedded in a GGUF file: llama.cpp stores the vocabulary, merges, token types,
special-token ids and chat template as metadata; for byte-level BPE (``tokenizer.ggml.model ==
"gpt2"``) this rebuilds the ``tokenizers`` engine transformers' GGUF loader builds
(docs/decoders.md)."""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers, processors
from tokenizers.models import BPE

from lmlab.utils.errors import LmlabError

CONTROL, USER_DEFINED = 3, 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre values whose split regex differs from GPT-2's; any other value (SmolLM2's
# "smollm", "gpt-2", "starcoder", ...) uses the ByteLevel pre-tokenizer's GPT-2 regex.
PRE_TOKENIZER_SPLITS = {
    "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT, "dbrx": _LLAMA3_SPLIT, "falcon3": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT,
}


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable characters."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    codes = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in codes)))


def build_engine(metadata: dict[str, Any]) -> Any:
    """A ``tokenizers.Tokenizer`` from GGUF tokenizer metadata (byte-level BPE only)."""
    kind = metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise LmlabError(f"GGUF tokenizer model {kind!r} is not supported",
                         "lmlab builds byte-level BPE tokenizers (tokenizer.ggml.model = gpt2); "
                         "load the model's tokenizer.json folder instead")
    tokens: list[str] = metadata["tokenizer.ggml.tokens"]
    merges = metadata.get("tokenizer.ggml.merges")
    if merges is None:
        raise LmlabError("the GGUF file has a BPE vocabulary but no merges",
                         "re-convert it with a llama.cpp converter that writes merges")
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    # Tokens outside the byte alphabet (added tokens spelled in plain text) are respelled as
    # their UTF-8 bytes, as transformers does, so the BPE model can hold them.
    vocab = {}
    for index, token in enumerate(tokens):
        key = token if set(token) <= alphabet else "".join(spelling[b] for b in token.encode())
        vocab.setdefault(key, index)
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    engine = Tokenizer(BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    split = PRE_TOKENIZER_SPLITS.get(metadata.get("tokenizer.ggml.pre"))
    if split is None:
        engine.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        engine.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    engine.decoder = decoders.ByteLevel()
    engine.post_processor = processors.ByteLevel(trim_offsets=False)
    bos_id = metadata.get("tokenizer.ggml.bos_token_id")
    if metadata.get("tokenizer.ggml.add_bos_token") and bos_id is not None:
        bos = tokens[int(bos_id)]  # Llama 3 style: every text starts with BOS
        engine.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, int(bos_id))])
    types = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    control = [AddedToken(t, normalized=False, special=True)
               for t, kind_ in zip(tokens, types) if kind_ == CONTROL and set(t) <= alphabet]
    if control:
        engine.add_special_tokens(control)
    user = [AddedToken(t, normalized=False, special=False)
            for t, kind_ in zip(tokens, types) if kind_ == USER_DEFINED and t in vocab]
    if user:
        engine.add_tokens(user)
    return engine


def load_gguf(path: str | os.PathLike) -> dict[str, Any]:
    """The parts of the :class:`lmlab.Tokenizer` of a GGUF file, as
    :func:`lmlab.tokenization.hf_files.load_folder` gives a folder's, plus ``attributes``: the
    chat template, whether every text starts with BOS, and llama.cpp's split rule."""
    from lmlab.formats.gguf import read_metadata

    metadata = read_metadata(path)
    engine = build_engine(metadata)
    tokens = metadata["tokenizer.ggml.tokens"]
    special: dict[str, str] = {}
    for role, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                      ("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id")):
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        if token_id is not None and 0 <= int(token_id) < len(tokens):
            special[role] = tokens[int(token_id)]
    types = metadata.get("tokenizer.ggml.token_type") or []
    roles = set(special.values())
    extra = [t for t, kind in zip(tokens, types) if kind == CONTROL and t not in roles]
    arch = metadata.get("general.architecture", "")
    return {"engine": engine, "family": "gpt2", "special": special, "extra": extra,
            "lowercase": False, "model_max_length": metadata.get(f"{arch}.context_length"),
            "padding_side": "right", "truncation_side": "right",
            "attributes": {"chat_template": metadata.get("tokenizer.chat_template"),
                           "add_bos_token": bool(metadata.get("tokenizer.ggml.add_bos_token",
                                                              False)),
                           "gguf_pre": metadata.get("tokenizer.ggml.pre")}}
