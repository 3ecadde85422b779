"""``lmlab.Tokenizer``: train, load, save and apply WordPiece, byte-level BPE and Unigram
tokenizers, and ByT5's byte tokenizer. The Rust ``tokenizers`` engine does the work; this class
keeps what the engine does not know (token roles, the family's template, the model's maximum
length) and speaks the Hugging Face calling convention (docs/tokenizers.md).

Example:
    >>> tok = Tokenizer.train("corpus/", kind="wordpiece", vocab_size=8000)
    >>> batch = tok(["a gloss", "another"], padding=True, return_tensors="pt")
    >>> tok.save_pretrained("my-tokenizer")
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken

from lmlab.tokenization.byte_level import (
    DEFAULT_EXTRA_IDS,
    byt5_parts,
    decode_bytes,
    saved_entries,
)
from lmlab.tokenization.encoding import BatchEncoding
from lmlab.tokenization.hf_files import load_folder, save_folder
from lmlab.tokenization.templates import (
    DEFAULT_FAMILY,
    FAMILIES,
    SPECIAL_ROLES,
    build_post_processor,
    get_family,
)
from lmlab.tokenization.training import KINDS, train_engine
from lmlab.utils.catalog import resolve_short_name
from lmlab.utils.checks import check_at_least, check_choice
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import read_json
from lmlab.utils.lazy import resolve_entry

_TRUNCATION_STRATEGIES = ("longest_first", "only_first", "only_second")
#: tokenizer_config.json's tokenizer_class -> "module:Class" of the tokenizers with no
#: vocabulary engine, which :meth:`Tokenizer.from_pretrained` hands such a folder to
OWN_TOKENIZERS: dict[str, object] = {
    "CanineTokenizer": "lmlab.tokenization.characters:CharacterTokenizer"}
_DEFAULT_MAX_LENGTH = {"bert": 512, "roberta": 512, "xlm-roberta": 512, "gpt2": 1024, "t5": 512, "byt5": 1024}


class Tokenizer:
    """A subword tokenizer (WordPiece, byte-level BPE or Unigram) over a ``tokenizers.Tokenizer``
    ``engine``, with a ``family``'s special-token template (``"bert"``, ``"roberta"``,
    ``"gpt2"``, ``"t5"``, ``"byt5"``) and its ``special_tokens`` (role -> token). Build one
    with :meth:`train`, :meth:`byt5` or :meth:`from_pretrained`; call it on texts to encode.
    ``do_lower_case`` is only recorded (the engine's normaliser decides).
    """

    def __init__(self, engine: Any, family: str = "bert", special_tokens: dict[str, str] | None = None,
                 additional_special_tokens: Sequence[str] = (), model_max_length: int | None = None,
                 do_lower_case: bool = True, padding_side: str = "right",
                 truncation_side: str = "right", name_or_path: str = ""):
        get_family(family)
        self._engine = engine
        self.family = family
        self._special = dict(special_tokens if special_tokens is not None
                             else FAMILIES[family].special_tokens)
        self.additional_special_tokens = list(additional_special_tokens)
        self.model_max_length = model_max_length or _DEFAULT_MAX_LENGTH[family]
        self.do_lower_case = do_lower_case
        self.padding_side = _side(padding_side, "padding_side")
        self.truncation_side = _side(truncation_side, "truncation_side")
        self.name_or_path = name_or_path
        engine.no_truncation()
        engine.no_padding()

    # ------------------------------------------------------------------ construction
    @classmethod
    def train(cls, source: str | os.PathLike | Iterable[str] | list[str | os.PathLike],
              kind: str = "wordpiece", vocab_size: int = 30522, min_frequency: int = 2,
              special_tokens: Sequence[str] | None = None, limit_alphabet: int | None = None,
              template: str | None = None, lowercase: bool = True,
              strip_accents: bool | None = None, extra_ids: int = 0,
              model_max_length: int | None = None, show_progress: bool = False,
              encoding_errors: str = "strict") -> Tokenizer:
        """Train a tokenizer on text streamed from ``source``: an lmlab corpus folder (its train
        split's sentences), a text file (one text per line), a list of them, or an iterable of
        strings.

        ``kind`` is ``"wordpiece"``, ``"bpe"`` (byte-level) or ``"unigram"``; ``template`` the
        special-token family (default bert / roberta / t5 for the three kinds), whose tokens
        get the first ids unless ``special_tokens`` says otherwise. ``vocab_size`` counts the
        special tokens; ``min_frequency`` and ``limit_alphabet`` apply to WordPiece and BPE,
        ``lowercase``/``strip_accents`` (None: strip when lower-casing, as BERT) to WordPiece
        and Unigram. ``extra_ids`` adds T5's ``<extra_id_N>`` sentinels at the top of the
        vocabulary. ``encoding_errors="replace"`` reads a non-UTF-8 byte as U+FFFD instead
        of refusing the file.
        """
        check_choice(kind, KINDS, "kind", "tokenizer kind")
        if template == "byt5":
            raise LmlabError("the byt5 template belongs to ByT5's byte tokenizer, which is not "
                             "trained", "use Tokenizer.byt5() (or pick another template)")
        family = get_family(template or DEFAULT_FAMILY[kind])
        if kind == "unigram" and family.name == "roberta":  # RoBERTa's tokens on SentencePiece
            family = get_family("xlm-roberta")
        roles = dict(family.special_tokens)
        ordered = list(special_tokens) if special_tokens is not None else family.ordered_tokens()
        missing = [tok for tok in family.ordered_tokens() if tok not in ordered]
        if missing:
            raise LmlabError(f"special_tokens {list(ordered)} lack {missing}, which the "
                             f"{family.name} template needs",
                             f"add {missing} to special_tokens or pick another template")
        unk = roles.get("unk_token", ordered[0])
        engine = train_engine(kind, source, vocab_size - extra_ids, min_frequency, ordered, unk,
                              limit_alphabet, lowercase, strip_accents, show_progress,
                              encoding_errors)
        extra = [f"<extra_id_{i}>" for i in range(extra_ids)]
        if extra:
            engine.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                       for t in reversed(extra)])
        engine.post_processor = build_post_processor(family.name, roles, engine.token_to_id,
                                                     byte_level=kind == "bpe")
        others = [tok for tok in ordered if tok not in roles.values()]
        return cls(engine, family=family.name, special_tokens=roles,
                   additional_special_tokens=[*others, *extra],
                   model_max_length=model_max_length, do_lower_case=lowercase)

    @classmethod
    def byt5(cls, extra_ids: int = DEFAULT_EXTRA_IDS,
             model_max_length: int | None = None) -> Tokenizer:
        """ByT5's byte tokenizer, nothing to train: id = UTF-8 byte + 3 after ``<pad>``,
        ``</s>``, ``<unk>``, then ``extra_ids`` sentinels ``<extra_id_0>`` (id 259), ...; ids
        equal transformers' ``ByT5Tokenizer`` (google/byt5-*: the default 125, 384 ids)."""
        check_at_least(extra_ids, 0, "extra_ids")
        parts = byt5_parts({"extra_ids": extra_ids, "model_max_length": model_max_length})
        return cls(parts["engine"], family="byt5", special_tokens=parts["special"],
                   additional_special_tokens=parts["extra"],
                   model_max_length=parts["model_max_length"], do_lower_case=False)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> Any:
        """Load a tokenizer folder (ours or Hugging Face's) or, for a ``.gguf`` path, the
        tokenizer embedded in a GGUF checkpoint. ``path`` may also be a short name from
        ``lmlab models list`` (``"minilm"``, ``"smollm2"``). A folder whose class has no
        vocabulary (:data:`OWN_TOKENIZERS`: CANINE's codepoints) loads as that class."""
        path = resolve_short_name(path)
        own = _own_tokenizer_class(path)
        if own is not None:
            return resolve_entry(OWN_TOKENIZERS, own).from_pretrained(path)
        if path.suffix.lower() == ".gguf":
            from lmlab.tokenization.gguf import load_gguf

            parts = load_gguf(path)
        else:
            if path.is_file() and path.name == "tokenizer.json":
                path = path.parent
            parts = load_folder(path)
        tokenizer = cls(parts["engine"], family=parts["family"], special_tokens=parts["special"],
                        additional_special_tokens=parts["extra"],
                        model_max_length=parts["model_max_length"],
                        do_lower_case=parts["lowercase"], padding_side=parts["padding_side"],
                        truncation_side=parts["truncation_side"], name_or_path=str(path))
        for name, value in parts.get("attributes", {}).items():
            setattr(tokenizer, name, value)  # a chat template; a GGUF file's BOS rule
        return tokenizer

    def save_pretrained(self, path: str | os.PathLike) -> list[Path]:
        """Write ``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json`` and
        the vocabulary files into folder ``path`` (each atomically). The folder loads with
        :meth:`from_pretrained` and with ``transformers.AutoTokenizer``."""
        extra = ({"additional_special_tokens": list(self.additional_special_tokens)}
                 if self.additional_special_tokens else {})
        config: dict[str, Any] = {
            "tokenizer_class": FAMILIES[self.family].tokenizer_class,
            "model_max_length": self.model_max_length,
            "padding_side": self.padding_side,
            "truncation_side": self.truncation_side,
            "do_lower_case": self.do_lower_case,
            # the engine decoder already cleans up spaces; a second pass would differ
            "clean_up_tokenization_spaces": False,
            **self._special,
            **extra,
            **FAMILIES[self.family].config,
        }
        if getattr(self, "chat_template", None):  # a GGUF file's or a folder's, kept
            config["chat_template"] = self.chat_template
        if self.family == "byt5":
            config.update(saved_entries(self._engine))
        elif self.family == "t5":
            config["extra_ids"] = sum(t.startswith("<extra_id_")
                                      for t in self.additional_special_tokens)
        return save_folder(Path(path), self._engine, config, {**self._special, **extra})

    # ------------------------------------------------------------------ vocabulary
    @property
    def backend_tokenizer(self) -> Any:
        """The Rust engine (``tokenizers.Tokenizer``); the fast path for bulk work."""
        return self._engine

    @property
    def vocab_size(self) -> int:
        """Size of the base vocabulary (without tokens added after training)."""
        return self._engine.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        """Size of the full vocabulary, added tokens included (the embedding rows needed)."""
        return self._engine.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self._engine.get_vocab(with_added_tokens=True)

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | None | list[int | None]:
        """Id of a token (or list of ids); unknown tokens map to the unk id."""
        if isinstance(tokens, str):
            token_id = self._engine.token_to_id(tokens)
            return self.unk_token_id if token_id is None else token_id
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> str | None | list[str | None]:
        if isinstance(ids, int):
            return self._engine.id_to_token(ids)
        return [self._engine.id_to_token(int(i)) for i in _to_list(ids)]

    def tokenize(self, text: str) -> list[str]:
        """The subword tokens of ``text`` (no special tokens)."""
        return self._engine.encode(text, add_special_tokens=False).tokens

    def _role_id(self, role: str) -> int | None:
        token = self._special.get(role)
        return None if token is None else self._engine.token_to_id(token)

    def _set_role(self, role: str, token: str | None) -> None:
        if token is None:
            self._special.pop(role, None)
            return
        if self._engine.token_to_id(token) is None:
            raise LmlabError(f"{role}={token!r} is not in the vocabulary",
                             "use a token of the vocabulary (e.g. tokenizer.eos_token)")
        self._special[role] = token

    pad_token = property(lambda self: self._special.get("pad_token"),
                         lambda self, t: self._set_role("pad_token", t))
    cls_token = property(lambda self: self._special.get("cls_token"))
    sep_token = property(lambda self: self._special.get("sep_token"))
    mask_token = property(lambda self: self._special.get("mask_token"))
    unk_token = property(lambda self: self._special.get("unk_token"))
    bos_token = property(lambda self: self._special.get("bos_token"))
    eos_token = property(lambda self: self._special.get("eos_token"))
    pad_token_id = property(lambda self: self._role_id("pad_token"))
    cls_token_id = property(lambda self: self._role_id("cls_token"))
    sep_token_id = property(lambda self: self._role_id("sep_token"))
    mask_token_id = property(lambda self: self._role_id("mask_token"))
    unk_token_id = property(lambda self: self._role_id("unk_token"))
    bos_token_id = property(lambda self: self._role_id("bos_token"))
    eos_token_id = property(lambda self: self._role_id("eos_token"))

    @property
    def special_tokens_map(self) -> dict[str, str]:
        return dict(self._special)

    @property
    def all_special_tokens(self) -> list[str]:
        return list(dict.fromkeys([*self._special.values(), *self.additional_special_tokens]))

    @property
    def all_special_ids(self) -> list[int]:
        return [self._engine.token_to_id(t) for t in self.all_special_tokens]

    def fingerprint(self) -> str:
        """SHA-256 of the serialized tokenizer (vocabulary, merges, normaliser, template) and
        its special-token roles. Token shards record it so ids are never read with another
        vocabulary. Per-call settings (truncation, padding) do not change it."""
        state = _rounded(json.loads(self._engine.to_str()))
        state["truncation"] = None
        state["padding"] = None
        payload = json.dumps({"engine": state, "family": self.family, "special": self._special},
                             sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()

    # ------------------------------------------------------------------ encoding
    def _configure(self, truncation: str | None, max_length: int | None, stride: int,
                   padding: str | None, pad_to_multiple_of: int | None,
                   padding_side: str, truncation_side: str) -> None:
        """Set the engine's truncation/padding for this call."""
        engine = self._engine
        if truncation is None:
            engine.no_truncation()
        else:
            try:
                engine.enable_truncation(max_length, stride=stride, strategy=truncation,
                                         direction=truncation_side)
            except Exception as error:
                raise LmlabError(f"cannot truncate to max_length={max_length} with "
                                 f"stride={stride}: {error}",
                                 "use a stride smaller than max_length minus the special "
                                 "tokens") from None
        if padding is None:
            engine.no_padding()
        else:
            pad_id = self.pad_token_id
            if pad_id is None:
                raise LmlabError(f"padding needs a pad token and this {self.family} tokenizer "
                                 "has none",
                                 "set tokenizer.pad_token = tokenizer.eos_token (GPT-2 style)")
            engine.enable_padding(direction=padding_side, pad_id=pad_id, pad_type_id=0,
                                  pad_token=self.pad_token,
                                  length=max_length if padding == "max_length" else None,
                                  pad_to_multiple_of=pad_to_multiple_of)

    def __call__(self, text: str | Sequence[str] | Sequence[Sequence[str]],
                 text_pair: str | Sequence[str] | None = None, *,
                 add_special_tokens: bool = True, padding: bool | str = False,
                 truncation: bool | str | None = None, max_length: int | None = None,
                 stride: int = 0, pad_to_multiple_of: int | None = None,
                 padding_side: str | None = None, truncation_side: str | None = None,
                 is_split_into_words: bool = False, return_tensors: str | None = None,
                 return_token_type_ids: bool | None = None, return_attention_mask: bool = True,
                 return_special_tokens_mask: bool = False, return_offsets_mapping: bool = False,
                 return_overflowing_tokens: bool = False,
                 return_length: bool = False) -> BatchEncoding:
        """Encode one text, a batch of texts (with ``is_split_into_words``: lists of words), or
        (batches of) pairs, with Hugging Face's keyword names and defaults (``token_type_ids``
        by default for BERT-family tokenizers only; ``max_length`` defaults to
        ``model_max_length``). Returns a :class:`BatchEncoding`: unbatched lists when ``text``
        is one string and no tensors are asked for.
        """
        batched = _is_batched(text, is_split_into_words)
        texts = list(text) if batched else [text]
        if text_pair is None:
            inputs: list[Any] = texts
        else:
            pairs = list(text_pair) if batched else [text_pair]
            if len(pairs) != len(texts):
                raise LmlabError(f"{len(texts)} texts but {len(pairs)} text pairs",
                                 "pass one pair per text")
            inputs = list(zip(texts, pairs))
        if not is_split_into_words:
            for item in texts if text_pair is None else [x for p in inputs for x in p]:
                if not isinstance(item, str):
                    raise LmlabError(f"texts must be strings, got {type(item).__name__}",
                                     "pass str or a list of str (is_split_into_words=True "
                                     "for lists of words)")

        trunc, length = _truncation_args(truncation, max_length, self.model_max_length)
        pad = _padding_arg(padding)
        if pad == "max_length":
            length = length or max_length or self.model_max_length
        if return_overflowing_tokens and trunc is None:
            raise LmlabError("return_overflowing_tokens needs truncation",
                             "pass truncation=True (or a strategy) and max_length")
        self._configure(trunc, length, stride if trunc else 0, pad, pad_to_multiple_of,
                        _side(padding_side or self.padding_side, "padding_side"),
                        _side(truncation_side or self.truncation_side, "truncation_side"))
        try:
            encodings = self._engine.encode_batch(inputs, is_pretokenized=is_split_into_words,
                                                  add_special_tokens=add_special_tokens)
        except BaseException as error:  # the engine's refusals: a cut with no room (Exception),
            # or no room for the stride (a panic: pyo3's PanicException is not an Exception)
            if type(error).__name__ != "PanicException" and "Truncation" not in str(error):
                raise
            raise LmlabError(f"cannot cut these texts to max_length={length} with "
                             f"truncation={trunc!r} and stride={stride}: {error}",
                             "use a larger max_length, a smaller stride, or truncation=True "
                             "(longest_first: a pair shares max_length between its two "
                             "texts)") from None
        mapping = None
        if return_overflowing_tokens:
            flat, mapping = [], []
            for index, encoding in enumerate(encodings):
                for piece in (encoding, *encoding.overflowing):
                    flat.append(piece)
                    mapping.append(index)
            encodings = flat

        if return_token_type_ids is None:
            return_token_type_ids = self.family == "bert"
        wanted = {"input_ids": "ids", "token_type_ids": return_token_type_ids and "type_ids",
                  "attention_mask": return_attention_mask and "attention_mask",
                  "special_tokens_mask": return_special_tokens_mask and "special_tokens_mask",
                  "offset_mapping": return_offsets_mapping and "offsets"}
        data: dict[str, Any] = {key: [getattr(e, field) for e in encodings]
                                for key, field in wanted.items() if field}
        if mapping is not None:
            data["overflow_to_sample_mapping"] = mapping
        if return_length:
            data["length"] = [len(e.ids) for e in encodings]
        if return_tensors is not None:
            data = _as_tensors(data, return_tensors)
        elif not batched and mapping is None:
            data = {key: value[0] for key, value in data.items()}
        return BatchEncoding(data, encodings)

    def encode(self, text: str, text_pair: str | None = None, add_special_tokens: bool = True,
               **kwargs: Any) -> list[int]:
        """Ids of one text (or pair), with the template's special tokens by default."""
        out = self(text, text_pair, add_special_tokens=add_special_tokens,
                   return_attention_mask=False, return_token_type_ids=False, **kwargs)
        return out["input_ids"]

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        """Text of a sequence of ids (list, tensor or array)."""
        ids = [int(i) for i in _to_list(ids)]
        if self.family == "byt5":
            return decode_bytes(self._engine, ids,
                                set(self.all_special_ids) if skip_special_tokens else set())
        return self._engine.decode(ids, skip_special_tokens=skip_special_tokens)

    def batch_decode(self, sequences: Any, skip_special_tokens: bool = False) -> list[str]:
        """Texts of a batch of id sequences (list of lists, 2-D tensor or array)."""
        rows = [[int(i) for i in _to_list(row)] for row in _to_list(sequences)]
        if self.family == "byt5":
            return [self.decode(row, skip_special_tokens) for row in rows]
        return self._engine.decode_batch(rows, skip_special_tokens=skip_special_tokens)

    def __repr__(self) -> str:
        kind = json.loads(self._engine.to_str())["model"]["type"]
        return (f"Tokenizer({kind}, family={self.family}, vocab={len(self)}, "
                f"max_length={self.model_max_length})")


def _rounded(value: Any) -> Any:
    """Floats rounded to 12 significant digits: Unigram scores may differ in the last bit
    after a save/load round trip, which must not change the fingerprint."""
    if isinstance(value, float):
        return float(f"{value:.12g}")
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def _side(value: str, name: str) -> str:
    return check_choice(value, ("right", "left"), name, "side")


def _is_batched(text: Any, split_into_words: bool) -> bool:
    if isinstance(text, str):
        if split_into_words:
            raise LmlabError("is_split_into_words=True needs a list of words, got a string",
                             "pass text.split() or set is_split_into_words=False")
        return False
    if isinstance(text, list | tuple):
        if split_into_words:
            return bool(text) and not isinstance(text[0], str)
        return True
    raise LmlabError(f"cannot encode a {type(text).__name__}", "pass a str or a list of str")


def _truncation_args(truncation: Any, max_length: int | None,
                     model_max: int) -> tuple[str | None, int | None]:
    if truncation is None:
        truncation = max_length is not None
    if truncation is False or truncation == "do_not_truncate":
        return None, max_length
    strategy = "longest_first" if truncation is True else truncation
    check_choice(strategy, _TRUNCATION_STRATEGIES, "truncation", "truncation strategy")
    return strategy, max_length or model_max


def _padding_arg(padding: Any) -> str | None:
    if padding is False or padding is None or padding == "do_not_pad":
        return None
    if padding is True:
        return "longest"
    return check_choice(padding, ("longest", "max_length"), "padding", "padding strategy")


def _to_list(values: Any) -> list:
    if hasattr(values, "tolist"):
        values = values.tolist()
    if isinstance(values, int):
        return [values]
    return list(values)


def _as_tensors(data: dict[str, Any], kind: str) -> dict[str, Any]:
    lengths = {len(row) for key, rows in data.items()
               if key not in ("overflow_to_sample_mapping", "length") for row in rows}
    if len(lengths) > 1:
        raise LmlabError("sequences of different lengths cannot form one tensor",
                         "pass padding=True (or padding='max_length' with max_length)")
    if check_choice(kind, ("pt", "np"), "return_tensors", "tensor kind") == "pt":
        import torch

        return {key: torch.tensor(value, dtype=torch.long) for key, value in data.items()}
    import numpy as np

    return {key: np.asarray(value, dtype=np.int64) for key, value in data.items()}


__all__ = ["Tokenizer", "BatchEncoding", "SPECIAL_ROLES"]


def _own_tokenizer_class(path: Path) -> str | None:
    """The folder's ``tokenizer_class`` where :data:`OWN_TOKENIZERS` has it, else None."""
    config = path / "tokenizer_config.json"
    if not (path.is_dir() and config.is_file()):
        return None
    name = read_json(config).get("tokenizer_class")
    return name if name in OWN_TOKENIZERS else None
