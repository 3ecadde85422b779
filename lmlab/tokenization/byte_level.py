"""ByT5's byte tokenizer on the ``tokenizers`` engine: id = UTF-8 byte + 3 (``<pad>`` 0,
``</s>`` 1, ``<unk>`` 2), the added tokens (``<extra_id_N>`` sentinels) from id 259 on, ``</s>``
appended. The engine splits the text into its bytes (GPT-2's byte-to-character map, one token
per byte), so truncation, padding, pairs and offsets work as for every other tokenizer; decoding
is done here, as transformers' ``ByT5Tokenizer`` does it (invalid UTF-8 is dropped, where the
engine's byte-level decoder would write U+FFFD). Built from a folder's settings the way
``ByT5Tokenizer`` reads them (docs/tokenizers.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as Engine

from lmlab.tokenization.templates import FAMILIES, build_post_processor
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import read_json

CLASS_NAME = "ByT5Tokenizer"
OFFSET = 3  # <pad>, </s>, <unk> come first
FIRST_ADDED = OFFSET + 256
DEFAULT_EXTRA_IDS = 125  # ByT5Tokenizer's default (google/byt5-*: vocab_size 384 = 3 + 256 + 125)


def _byte_chars() -> list[str]:
    """GPT-2's byte -> printable character map (the ByteLevel pre-tokeniser's), by byte."""
    kept = {*range(33, 127), *range(161, 173), *range(174, 256)}
    spare = iter(range(256, 512))
    return [chr(b) if b in kept else chr(next(spare)) for b in range(256)]


def is_byt5_folder(folder: Path, config: dict[str, Any]) -> bool:
    """True when the folder's tokenizer is ByT5's: ``tokenizer_config.json`` names the class,
    or, as in google/byt5-* folders, only ``config.json`` does (transformers reads it there)."""
    if config.get("tokenizer_class"):
        return config["tokenizer_class"] == CLASS_NAME
    model_config = folder / "config.json"
    try:
        return (model_config.is_file()
                and read_json(model_config).get("tokenizer_class") == CLASS_NAME)
    except ValueError:
        return False


def _content(value: Any) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


def _added_tokens(config: dict[str, Any], folder: Path | None) -> list[AddedToken]:
    """The tokens after the 256 bytes, in id order: a saved folder's ``added_tokens_decoder``
    (or ``added_tokens.json``), else ``additional_special_tokens``, else ``extra_ids``
    sentinels ``<extra_id_0>`` (id 259), ``<extra_id_1>``, ... as ``ByT5Tokenizer`` adds them."""
    table = config.get("added_tokens_decoder") or {}
    if not table and folder is not None and (folder / "added_tokens.json").is_file():
        table = {index: {"content": token}
                 for token, index in read_json(folder / "added_tokens.json").items()}
    rows = sorted((int(index), entry) for index, entry in table.items()
                  if int(index) >= FIRST_ADDED)
    if rows:
        ids = [index for index, _ in rows]
        if ids != list(range(FIRST_ADDED, FIRST_ADDED + len(ids))):
            raise LmlabError(f"the added tokens of {folder} have ids {ids[:5]}..., not "
                             f"{FIRST_ADDED}, {FIRST_ADDED + 1}, ... after the bytes",
                             "number the added tokens from 259 on in tokenizer_config.json")
        return [AddedToken(_content(entry), lstrip=bool(entry.get("lstrip")),
                           rstrip=bool(entry.get("rstrip")), normalized=False, special=True)
                for _, entry in rows]
    names = config.get("additional_special_tokens") or config.get("extra_special_tokens")
    if isinstance(names, dict):
        names = list(names.values())
    if not names:
        names = [f"<extra_id_{i}>" for i in range(int(config.get("extra_ids", DEFAULT_EXTRA_IDS)))]
    return [AddedToken(_content(name), normalized=False, special=True) for name in names]


def byt5_parts(config: dict[str, Any], folder: Path | None = None) -> dict[str, Any]:
    """The parts of a ByT5 :class:`~lmlab.tokenization.tokenizer.Tokenizer` (as
    :func:`~lmlab.tokenization.hf_files.load_folder` returns them) from a folder's merged
    ``tokenizer_config.json`` / ``special_tokens_map.json`` settings."""
    special = {role: _content(config.get(role)) or token
               for role, token in FAMILIES["byt5"].special_tokens.items()}
    firsts = [special["pad_token"], special["eos_token"], special["unk_token"]]
    if len(set(firsts)) < 3:
        raise LmlabError(f"ByT5's pad, eos and unk tokens must differ, got {firsts}",
                         "give them distinct names in tokenizer_config.json")
    vocab = {token: index for index, token in enumerate(firsts)}
    vocab.update({char: OFFSET + byte for byte, char in enumerate(_byte_chars())})
    engine = Engine(models.WordLevel(vocab, unk_token=special["unk_token"]))
    engine.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        pre_tokenizers.Split(Regex("."), behavior="isolated")])  # one token per byte
    engine.decoder = decoders.ByteLevel()
    # ByT5Tokenizer strips the spaces around its pad/eos/unk tokens in a text
    engine.add_special_tokens([AddedToken(t, lstrip=True, rstrip=True, normalized=False,
                                          special=True) for t in firsts])
    added = _added_tokens(config, folder)
    clash = [t.content for t in added if t.content in vocab]
    if clash:
        raise LmlabError(f"added tokens {clash} repeat a special token or a byte",
                         "remove them from the added tokens in tokenizer_config.json")
    engine.add_special_tokens(added)
    engine.post_processor = build_post_processor("byt5", special, engine.token_to_id)
    max_length = config.get("model_max_length")
    return {"engine": engine, "family": "byt5", "special": special,
            "extra": [t.content for t in added], "lowercase": False,
            "model_max_length": int(max_length) if isinstance(max_length, int | float)
            and max_length < 10 ** 12 else None,
            "padding_side": config.get("padding_side", "right"),
            "truncation_side": config.get("truncation_side", "right")}


def saved_entries(engine: Any) -> dict[str, Any]:
    """``tokenizer_config.json`` entries that make ``ByT5Tokenizer`` number every added token
    as the engine does."""
    table = engine.get_added_tokens_decoder()
    return {"extra_ids": 0, "added_tokens_decoder": {
        str(index): {"content": t.content, "lstrip": t.lstrip, "rstrip": t.rstrip,
                     "normalized": False, "single_word": False, "special": True}
        for index, t in sorted(table.items())}}


def decode_bytes(engine: Any, ids: list[int], skip: set[int]) -> str:
    """Text of ``ids``: the bytes joined and read as UTF-8, invalid sequences dropped (as
    ``ByT5Tokenizer``); added tokens as their text unless their id is in ``skip``."""
    out = bytearray()
    for index in ids:
        if index in skip:
            continue
        if OFFSET <= index < FIRST_ADDED:
            out.append(index - OFFSET)
        elif (token := engine.id_to_token(index)) is not None:
            out += token.encode("utf-8")
    return out.decode("utf-8", errors="ignore")
