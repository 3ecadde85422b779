"""Reading and writing Hugging Face tokenizer folders: ByT5's (no vocabulary file), else
``tokenizer.json`` (with the special tokens, ``do_lower_case`` and ``model_max_length`` of
``tokenizer_config.json`` / ``special_tokens_map.json``), else a bare ``vocab.txt`` (BERT
WordPiece), else ``vocab.json`` + ``merges.txt`` (byte-level BPE). Writing adds the model's own
vocabulary files; every file is written atomically."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, models
from tokenizers import Tokenizer as Engine

from lmlab.tokenization.byte_level import byt5_parts, is_byt5_folder
from lmlab.tokenization.templates import (
    CLASS_TO_FAMILY,
    FAMILIES,
    SPECIAL_ROLES,
    build_post_processor,
)
from lmlab.tokenization.training import build_engine
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import atomic_write_bytes, atomic_write_json, read_json

KNOWN_FILES = ("tokenizer.json", "vocab.txt", "vocab.json + merges.txt")
_HUGE = 10 ** 12  # transformers writes int(1e30) when a model has no length limit


def _token_content(value: Any) -> str | None:
    """Special tokens are strings or AddedToken dicts ``{"content": ...}`` in HF configs."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def read_folder_config(folder: Path) -> dict[str, Any]:
    """Merged ``special_tokens_map.json`` and ``tokenizer_config.json`` (config wins)."""
    merged: dict[str, Any] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        path = folder / name
        if path.exists():
            try:
                merged.update(read_json(path))
            except json.JSONDecodeError as error:
                raise LmlabError(f"{path} is not valid JSON ({error})",
                                 "repair or delete the file") from None
    return merged


def special_tokens_from_config(config: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    """Role -> token and the additional special tokens named in an HF config."""
    special = {role: tok for role in SPECIAL_ROLES
               if (tok := _token_content(config.get(role))) is not None}
    extra = [tok for item in config.get("additional_special_tokens") or []
             if (tok := _token_content(item)) is not None]
    return special, extra


def family_from_config(config: dict[str, Any], engine: Any) -> str:
    """Guess the special-token family from ``tokenizer_class`` or the engine's pipeline."""
    cls = config.get("tokenizer_class")
    if cls in CLASS_TO_FAMILY:
        return CLASS_TO_FAMILY[cls]
    state = json.loads(engine.to_str())
    post = (state.get("post_processor") or {}).get("type")
    model = (state.get("model") or {}).get("type")
    if post == "BertProcessing" or model == "WordPiece":
        return "bert"
    if model == "Unigram" and (post == "RobertaProcessing" or _starts_with(state, "<s>")):
        return "xlm-roberta"  # SentencePiece with RoBERTa's <s> ... </s>
    if post == "RobertaProcessing":
        return "roberta"
    if model == "Unigram":
        return "t5"
    return "gpt2"


def _starts_with(state: dict[str, Any], token: str) -> bool:
    """Whether the engine's template puts ``token`` first in a single text."""
    post = state.get("post_processor") or {}
    first = (post.get("single") or [{}])[0] if post.get("type") == "TemplateProcessing" else {}
    return (first.get("SpecialToken") or {}).get("id") == token


def model_max_length(config: dict[str, Any]) -> int | None:
    value = config.get("model_max_length")
    return int(value) if isinstance(value, int | float) and value < _HUGE else None


def load_folder(folder: Path) -> dict[str, Any]:
    """Load a Hugging Face tokenizer folder into the parts a :class:`Tokenizer` is made of."""
    if not folder.is_dir():
        raise LmlabError(f"tokenizer path {folder} does not exist",
                         "pass a folder holding tokenizer.json, vocab.txt or vocab.json + "
                         "merges.txt (or a .gguf file)")
    config = read_folder_config(folder)
    if is_byt5_folder(folder, config):  # no vocabulary file: the bytes are the vocabulary
        return byt5_parts(config, folder)
    special, extra = special_tokens_from_config(config)
    lowercase = bool(config.get("do_lower_case", True))
    if (folder / "tokenizer.json").exists():
        try:
            engine = Engine.from_file(str(folder / "tokenizer.json"))
        except Exception as error:
            raise LmlabError(f"{folder / 'tokenizer.json'} cannot be read ({error})",
                             "re-save the tokenizer or delete the broken file") from None
        family = family_from_config(config, engine)
        if not special:  # a bare tokenizer.json: take the family's tokens that exist in it
            special = {role: tok for role, tok in FAMILIES[family].special_tokens.items()
                       if engine.token_to_id(tok) is not None}
        state = json.loads(engine.to_str())
        norm = state.get("normalizer") or {}
        if norm.get("type") == "BertNormalizer":
            lowercase = bool(norm.get("lowercase", lowercase))
    elif (folder / "vocab.txt").exists():
        family = "bert"
        special = special or dict(FAMILIES["bert"].special_tokens)
        engine = _bert_from_vocab_txt(folder / "vocab.txt", special, lowercase,
                                      config.get("strip_accents"),
                                      bool(config.get("tokenize_chinese_chars", True)))
    elif (folder / "vocab.json").exists() and (folder / "merges.txt").exists():
        family = CLASS_TO_FAMILY.get(config.get("tokenizer_class"))
        if family not in ("gpt2", "roberta"):
            family = "gpt2"
        special = special or dict(FAMILIES[family].special_tokens)
        engine = _bpe_from_vocab_merges(folder, special, family)
    else:
        present = sorted(p.name for p in folder.iterdir())[:20]
        raise LmlabError(f"{folder} holds no tokenizer files (looked for "
                         f"{', '.join(KNOWN_FILES)}; found: {', '.join(present) or 'nothing'})",
                         "point at a folder saved with save_pretrained or a Hugging Face "
                         "tokenizer folder")
    check_special_tokens(engine, special, extra, folder)
    return {"engine": engine, "family": family, "special": special, "extra": extra,
            "lowercase": lowercase, "model_max_length": model_max_length(config),
            "padding_side": config.get("padding_side", "right"),
            "truncation_side": config.get("truncation_side", "right"),
            "attributes": {"chat_template": chat_template(folder, config)}}


def chat_template(folder: Path, config: dict[str, Any]) -> str | None:
    """The folder's chat template as transformers reads it: ``chat_template.jinja`` (what it
    writes since 4.43), else ``tokenizer_config.json``'s ``chat_template`` (a string, or a list
    of named templates: the one named "default"); None when there is none."""
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {entry.get("name"): entry.get("template") for entry in template}
        template = named.get("default")
    return template if isinstance(template, str) and template else None


def check_special_tokens(engine: Any, special: dict[str, str], extra: list[str],
                         where: Any) -> None:
    """Every declared special token must have an id; mark them special in the engine."""
    missing = sorted({tok for tok in [*special.values(), *extra]
                      if engine.token_to_id(tok) is None})
    if missing:
        raise LmlabError(f"special tokens {missing} of {where} are not in its vocabulary",
                         "add them to the vocabulary (vocab.txt / tokenizer.json) or remove "
                         "them from tokenizer_config.json / special_tokens_map.json")
    known = {t.content for t in engine.get_added_tokens_decoder().values() if t.special}
    new = [tok for tok in dict.fromkeys([*special.values(), *extra]) if tok not in known]
    if new:
        engine.add_special_tokens([AddedToken(tok, special=True, normalized=False) for tok in new])


def _bert_from_vocab_txt(path: Path, special: dict[str, str], lowercase: bool,
                         strip_accents: bool | None, chinese: bool) -> Any:
    """The engine ``BertTokenizerFast`` builds from a bare ``vocab.txt``: the WordPiece
    pipeline :func:`~lmlab.tokenization.training.build_engine` trains, with this vocabulary."""
    vocab: dict[str, int] = {}
    with open(path, encoding="utf-8") as handle:
        for index, line in enumerate(handle):
            token = line.rstrip("\n")
            vocab.setdefault(token, index)
    unk = special.get("unk_token", "[UNK]")
    if unk not in vocab:
        raise LmlabError(f"special tokens ['{unk}'] of {path} are not in its vocabulary",
                         f"add {unk} to vocab.txt or set unk_token in tokenizer_config.json")
    engine = build_engine("wordpiece", lowercase, strip_accents, unk, chinese)
    engine.model = models.WordPiece(vocab, unk_token=unk, max_input_chars_per_word=100)
    check_special_tokens(engine, special, [], path)
    engine.post_processor = build_post_processor("bert", special, engine.token_to_id)
    return engine


def _bpe_from_vocab_merges(folder: Path, special: dict[str, str], family: str) -> Any:
    """The engine ``GPT2TokenizerFast`` / ``RobertaTokenizerFast`` build from vocab + merges:
    the byte-level pipeline :func:`~lmlab.tokenization.training.build_engine` trains."""
    engine = build_engine("bpe")
    engine.model = models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt"))
    check_special_tokens(engine, special, [], folder)
    engine.post_processor = build_post_processor(family, special, engine.token_to_id,
                                                 byte_level=True)
    return engine


def save_folder(folder: Path, engine: Any, tokenizer_config: dict[str, Any],
                special_map: dict[str, Any]) -> list[Path]:
    """Write the tokenizer files into ``folder``, each atomically; returns the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    state = json.loads(engine.to_str())
    state["truncation"] = None  # per-call settings are not part of the saved tokenizer
    state["padding"] = None
    atomic_write_bytes(folder / "tokenizer.json",
                       json.dumps(state, ensure_ascii=False, indent=2).encode("utf-8"))
    written.append(folder / "tokenizer.json")
    atomic_write_json(folder / "tokenizer_config.json", tokenizer_config)
    atomic_write_json(folder / "special_tokens_map.json", special_map)
    written += [folder / "tokenizer_config.json", folder / "special_tokens_map.json"]
    if state.get("model", {}).get("type") in ("WordPiece", "BPE"):
        # The model's own files (vocab.txt; vocab.json + merges.txt) for loaders that want them.
        with tempfile.TemporaryDirectory(dir=folder, prefix=".model-") as tmp:
            for name in engine.model.save(tmp):
                target = folder / Path(name).name
                atomic_write_bytes(target, Path(name).read_bytes())
                written.append(target)
    return written
