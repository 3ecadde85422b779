"""Training WordPiece (BERT), byte-level BPE (GPT-2 / RoBERTa) and Unigram (SentencePiece /
T5) vocabularies with the Rust ``tokenizers`` engine, the text streamed to it in batches so a
corpus larger than memory can be used (the three pipelines: docs/tokenizers.md)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from lmlab.text.corpus import read_corpus
from lmlab.text.textfile import check_encoding_errors, iter_lines
from lmlab.utils.checks import check_choice
from lmlab.utils.errors import LmlabError

KINDS = ("wordpiece", "bpe", "unigram")

TextSource = str | os.PathLike | Iterable[str]


def check_training_source(source: TextSource | list[str | os.PathLike]) -> list[Path] | None:
    """The files (or corpus folders) ``source`` names, each checked to exist before any work (a
    missing file must never be taken for a text, nor turn into "holds no text" half-way through
    training); None when ``source`` holds the texts themselves. A list is of files when an item
    is a ``Path`` or every item is a string naming an existing file."""
    if isinstance(source, str | os.PathLike):
        items = [source]
    elif isinstance(source, list | tuple) and source and (
            any(isinstance(item, os.PathLike) for item in source)
            or all(isinstance(item, str) and os.path.isfile(item) for item in source)):
        items = list(source)
    else:
        return None
    paths = [Path(item) for item in items]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise LmlabError(f"training text file(s) not found: {', '.join(missing)}",
                         "check the paths; pass text files (one text per line), an lmlab corpus "
                         "folder, or an iterator of strings")
    return paths


def iter_training_texts(source: TextSource | list[str | os.PathLike],
                        encoding_errors: str = "strict") -> Iterator[str]:
    """Stream the texts of ``source``: an lmlab corpus folder (every sentence of its train
    split), a text file (one text per line), a list of text files, or an iterable of strings.

    A byte that is not UTF-8 in a text file is an error naming the file and its byte offset
    (``encoding_errors="strict"``) or is read as U+FFFD with one warning (``"replace"``).
    """
    paths = check_training_source(source)
    if paths is None:
        for text in source:
            if not isinstance(text, str):
                raise LmlabError(f"training texts must be strings, got {type(text).__name__}",
                                 "pass an iterator of str, text files or a corpus folder")
            yield text
        return
    for path in paths:
        if path.is_dir():
            if not (path / "train.jsonl").exists():
                raise LmlabError(f"{path} is a folder but not an lmlab corpus (no train.jsonl)",
                                 "build a corpus with `lmlab data build --out DIR` or pass text "
                                 "files")
            for document in read_corpus(path, "train"):
                yield from document.sentences
            continue
        for number, line in iter_lines(path, errors=encoding_errors):
            if line is None:
                raise LmlabError(f"{path}:{number} is longer than 16,000,000 characters",
                                 "put one text per line (a sentence or a paragraph)")
            yield line.rstrip("\r")


def _batches(texts: Iterator[str], counter: dict[str, Any], size: int = 1000) -> Iterator[list[str]]:
    """Group texts into lists (the engine's iterator API is faster on batches) and count them.

    An :class:`LmlabError` raised while reading (a bad byte, a missing file) is kept in
    ``counter["error"]``: the engine would otherwise swallow it into its own exception."""
    batch: list[str] = []
    try:
        for text in texts:
            if text.strip():
                counter["texts"] += 1
                counter["chars"] += len(text)
                batch.append(text)
                if len(batch) == size:
                    yield batch
                    batch = []
    except LmlabError as error:
        counter["error"] = error
        raise
    if batch:
        yield batch


def build_engine(kind: str, lowercase: bool = True, strip_accents: bool | None = None,
                 unk_token: str = "[UNK]", chinese_chars: bool = True) -> Any:
    """An untrained engine ``tokenizers.Tokenizer`` with ``kind``'s normaliser, pre-tokeniser,
    model and decoder (``chinese_chars``: WordPiece splits CJK characters apart, as BERT)."""
    check_choice(kind, KINDS, "kind", "tokenizer kind")
    if kind == "wordpiece":
        engine = Tokenizer(models.WordPiece(unk_token=unk_token, continuing_subword_prefix="##",
                                            max_input_chars_per_word=100))
        engine.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=chinese_chars, strip_accents=strip_accents,
            lowercase=lowercase)
        engine.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        engine.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    elif kind == "bpe":
        engine = Tokenizer(models.BPE())
        engine.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        engine.decoder = decoders.ByteLevel()
    else:  # unigram
        engine = Tokenizer(models.Unigram())
        steps = [normalizers.NFKC()]
        if lowercase:
            steps.append(normalizers.Lowercase())
        if strip_accents:
            steps[:0] = [normalizers.NFD(), normalizers.StripAccents()]
        engine.normalizer = normalizers.Sequence(steps)
        engine.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        engine.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return engine


def train_engine(kind: str, source: TextSource, vocab_size: int, min_frequency: int,
                 special_tokens: list[str], unk_token: str, limit_alphabet: int | None,
                 lowercase: bool, strip_accents: bool | None, show_progress: bool,
                 encoding_errors: str = "strict") -> Any:
    """Train an engine tokenizer of ``kind`` on the streamed ``source``; checks the result."""
    check_encoding_errors(encoding_errors)
    check_training_source(source)

    if vocab_size <= len(special_tokens):
        raise LmlabError(f"vocab_size={vocab_size} leaves no room beyond the "
                         f"{len(special_tokens)} special tokens",
                         "raise vocab_size (BERT uses 30522, GPT-2 50257)")
    engine = build_engine(kind, lowercase=lowercase, strip_accents=strip_accents,
                          unk_token=unk_token)
    alphabet_limit = {} if limit_alphabet is None else {"limit_alphabet": limit_alphabet}
    if kind == "wordpiece":
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=special_tokens,
            continuing_subword_prefix="##", show_progress=show_progress, **alphabet_limit)
    elif kind == "bpe":
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        if vocab_size < len(alphabet) + len(special_tokens):
            raise LmlabError(
                f"vocab_size={vocab_size} is smaller than the byte-level alphabet "
                f"({len(alphabet)} bytes + {len(special_tokens)} special tokens)",
                f"raise vocab_size to at least {len(alphabet) + len(special_tokens)} "
                "(byte-level BPE always keeps all 256 bytes, so limit_alphabet cannot help)")
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=special_tokens,
            initial_alphabet=alphabet, show_progress=show_progress, **alphabet_limit)
    else:
        trainer = trainers.UnigramTrainer(
            vocab_size=vocab_size, special_tokens=special_tokens, unk_token=unk_token,
            show_progress=show_progress)

    counter: dict[str, Any] = {"texts": 0, "chars": 0, "error": None}
    texts = iter_training_texts(source, encoding_errors)
    try:
        engine.train_from_iterator(_batches(texts, counter), trainer=trainer)
    except Exception as error:  # the engine raises plain Exception subclasses
        if counter["error"] is not None:
            raise counter["error"] from None
        if counter["texts"] == 0:
            raise _empty_corpus_error(source) from None
        if "not large enough to contain all chars" in str(error):
            raise _alphabet_error(vocab_size, None) from None
        if isinstance(error, LmlabError):
            raise
        raise LmlabError(f"tokenizer training failed: {error}",
                         "check the training texts and the vocab_size") from error
    if counter["texts"] == 0:
        raise _empty_corpus_error(source)
    trained = engine.get_vocab_size(with_added_tokens=True)
    if trained > vocab_size:
        # WordPiece keeps every character of the alphabet even when that exceeds vocab_size.
        raise _alphabet_error(vocab_size, trained)
    return engine


def _empty_corpus_error(source: Any) -> LmlabError:
    name = source if isinstance(source, str | os.PathLike) else "the training iterator"
    return LmlabError(f"{name} holds no text to train a tokenizer on",
                      "check the corpus path / split, or pass non-empty texts")


def _alphabet_error(vocab_size: int, trained: int | None) -> LmlabError:
    got = "" if trained is None else f" (the alphabet alone gave {trained} entries)"
    return LmlabError(
        f"vocab_size={vocab_size} is smaller than the corpus alphabet plus special tokens{got}",
        "raise vocab_size, or set limit_alphabet (e.g. limit_alphabet=1000) to keep only the "
        "most frequent characters")
