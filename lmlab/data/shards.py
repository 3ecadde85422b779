"""Token shards: a tokenized corpus on disk, in fixed-size memory-mappable files, written in
bounded memory; a killed run resumes after its last finished shard and produces the same bytes
(docs/shards.md: the layout, the pipeline and the resume rules)."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import sys
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer as Engine

from lmlab.text.corpus import REBUILD, SPLITS, Document, split_path
from lmlab.text.textfile import check_encoding_errors, iter_lines
from lmlab.tokenization.characters import engine_from_str
from lmlab.tokenization.tokenizer import Tokenizer
from lmlab.utils.checks import check_at_least, check_output_folder
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import atomic_path, atomic_write_json, json_record, read_json, sha256_file
from lmlab.utils.progress import progress

FORMAT = "lmlab-token-shards"
VERSION = 1
MANIFEST = "manifest.json"
DEFAULT_SHARD_TOKENS = 1 << 24  # 16.8M tokens: 32 MiB per uint16 shard
_CHUNK_DOCS = 256


def token_dtype(vocab_size: int) -> str:
    """``uint16`` when every id fits, else ``uint32``."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


@dataclass
class EncodedChunk:
    """Tokens of a run of documents, with one row per kept (non-empty) sentence."""

    ids: Any            # (N,) token ids, uint32
    word_starts: Any    # (N,) uint8
    sent_starts: Any    # (S,) int64 offset of each sentence in ``ids``
    sent_lengths: Any   # (S,) int64
    sent_line: Any      # (S,) int64 corpus line (document index) of each sentence
    sent_index: Any     # (S,) int64 sentence index within its document
    line_sources: dict[int, str] | None = None  # corpus line (document index) -> source name


def plain_engine(tokenizer: Any) -> Any:
    """A copy of the tokenizer's engine (an ``lmlab.Tokenizer``'s or a ``tokenizers.Tokenizer``)
    with truncation and padding off; the caller's keeps its settings."""
    if hasattr(tokenizer, "plain_engine"):  # CANINE's codepoints: no Rust engine
        return tokenizer.plain_engine()
    engine = Engine.from_str(getattr(tokenizer, "backend_tokenizer", tokenizer).to_str())
    engine.no_truncation()
    engine.no_padding()
    return engine


def encode_sentences(engine: Any, sentences: list[str]) -> tuple[Any, Any, Any]:
    """Token ids (N,) uint32, word-start flags (N,) uint8 and lengths (S,) int64 of
    ``sentences`` encoded without special tokens; a sentence's first token starts a word."""
    encodings = engine.encode_batch(sentences, add_special_tokens=False)
    lengths = np.fromiter((len(e) for e in encodings), dtype=np.int64, count=len(encodings))
    total = int(lengths.sum())
    ids = np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), dtype=np.uint32,
                      count=total)
    words = np.fromiter(itertools.chain.from_iterable(e.word_ids for e in encodings),
                        dtype=np.int64, count=total)
    word_starts = np.ones(total, dtype=np.uint8)
    if total > 1:
        word_starts[1:] = words[1:] != words[:-1]
    word_starts[(np.cumsum(lengths) - lengths)[lengths > 0]] = 1
    return ids, word_starts, lengths


def encode_lines(engine: Any, lines: list[str], first_line: int) -> EncodedChunk:
    """Encode corpus lines (JSON documents) sentence by sentence, without special tokens."""
    sentences: list[str] = []
    lines_of: list[int] = []
    index_of: list[int] = []
    sources: dict[int, str] = {}
    for offset, line in enumerate(lines):
        where = f"corpus line {first_line + offset + 1}"
        document = Document.from_record(json_record(line, where, REBUILD), where)
        sources[first_line + offset] = document.source
        for index, sentence in enumerate(document.sentences):
            sentences.append(sentence)
            lines_of.append(first_line + offset)
            index_of.append(index)
    ids, word_starts, lengths = encode_sentences(engine, sentences)
    keep = lengths > 0
    lengths = lengths[keep]
    starts = np.cumsum(lengths) - lengths
    return EncodedChunk(ids, word_starts, starts, lengths,
                        np.asarray(lines_of, dtype=np.int64)[keep],
                        np.asarray(index_of, dtype=np.int64)[keep], sources)


class _SplitWriter:
    """Appends encoded chunks of one split to fixed-size shards; records boundaries."""

    def __init__(self, out: Path, split: str, dtype: str, shard_tokens: int,
                 finished: list[dict], on_shard: Any):
        self.out, self.split, self.dtype, self.shard_tokens = out, split, dtype, shard_tokens
        self.shards = list(finished)
        self.on_shard = on_shard
        self.total = sum(s["num_tokens"] for s in finished)
        self.last_line = finished[-1]["resume"][0] if finished else -1
        # (document, sentence, tokens into it) where the finished shards end: writing resumes there
        self.resume_at = tuple(finished[-1]["resume"]) if finished else (0, 0, 0)
        # each document's source, as a code into source_names (shards of an older lmlab lack it)
        self.with_sources = all("srcs" in shard["files"] for shard in finished)
        self.source_names: list[str] = list(finished[-1].get("sources", [])) if finished else []
        self._open = None

    def _start(self) -> None:
        index = len(self.shards)
        stem = f"{self.split}-{index:05d}"
        names = {"tokens": f"{stem}.bin", "words": f"{stem}.words.bin"}
        # boundary offsets also stream to disk (raw int64), so memory does not grow with the
        # shard either; they become .npy files when the shard is finished
        boundaries = {"docs": f"{stem}.docs.npy", "sents": f"{stem}.sents.npy"}
        if self.with_sources:
            boundaries["srcs"] = f"{stem}.srcs.npy"
        self._open = {
            "stem": stem, "names": names, "boundaries": boundaries, "count": 0,
            "files": {k: open(self.out / f".{n}.partial", "wb")
                      for k, n in {**names, **boundaries}.items()},
            "hash": {k: hashlib.sha256() for k in names},
        }

    def _append(self, kind: str, array: Any) -> None:
        data = array.tobytes()
        self._open["files"][kind].write(data)
        self._open["hash"][kind].update(data)

    def write(self, chunk: EncodedChunk, skip: int = 0) -> None:
        """Append ``chunk`` from token ``skip`` on (the rest was written before a resume)."""
        doc_start = np.ones(len(chunk.sent_line), dtype=bool)
        if len(doc_start):
            doc_start[1:] = chunk.sent_line[1:] != chunk.sent_line[:-1]
            doc_start[0] = chunk.sent_line[0] != self.last_line
            self.last_line = int(chunk.sent_line[-1])
        pos, end = skip, len(chunk.ids)
        while pos < end:
            if self._open is None:
                self._start()
            take = min(self.shard_tokens - self._open["count"], end - pos)
            lo = np.searchsorted(chunk.sent_starts, pos, "left")
            hi = np.searchsorted(chunk.sent_starts, pos + take, "left")
            base = self.total - pos  # global offset of chunk token 0
            files = self._open["files"]
            files["sents"].write((chunk.sent_starts[lo:hi] + base).astype(np.int64).tobytes())
            files["docs"].write((chunk.sent_starts[lo:hi][doc_start[lo:hi]] + base)
                                .astype(np.int64).tobytes())
            if self.with_sources:
                files["srcs"].write(np.asarray(
                    [self._source_code(chunk.line_sources[line])
                     for line in chunk.sent_line[lo:hi][doc_start[lo:hi]].tolist()],
                    dtype=np.int64).tobytes())
            self._append("tokens", chunk.ids[pos:pos + take].astype(self.dtype))
            self._append("words", chunk.word_starts[pos:pos + take])
            self._open["count"] += take
            self.total += take
            pos += take
            if self._open["count"] == self.shard_tokens:
                last = int(np.searchsorted(chunk.sent_starts, pos - 1, "right")) - 1
                self._finish([int(chunk.sent_line[last]), int(chunk.sent_index[last]),
                              pos - int(chunk.sent_starts[last])])

    def _source_code(self, name: str) -> int:
        if name not in self.source_names:
            self.source_names.append(name)
        return self.source_names.index(name)

    def _finish(self, resume: list[int]) -> None:
        shard = self._open
        self._open = None
        files = {}
        for kind, name in shard["names"].items():
            handle = shard["files"][kind]
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
            os.replace(self.out / f".{name}.partial", self.out / name)
            files[kind] = {"file": name, "sha256": shard["hash"][kind].hexdigest()}
        for kind, name in shard["boundaries"].items():
            shard["files"][kind].close()
            raw = self.out / f".{name}.partial"
            with open(raw, "rb") as source:
                files[kind] = _write_int64_npy(self.out / name, raw.stat().st_size // 8,
                                               iter(lambda: source.read(1 << 20), b""))
            raw.unlink()
        entry = {"num_tokens": shard["count"], "files": files, "resume": resume}
        if self.with_sources:
            entry["sources"] = list(self.source_names)
        self.shards.append(entry)
        self.on_shard(self.shards)

    def write_all(self, chunks: Iterable[EncodedChunk], bar: Any = None) -> None:
        """Write the split's encoded chunks (the first one starts at document ``resume_at[0]``;
        what the finished shards hold of it is skipped) and finish the last shard."""
        line, sentence, tokens = self.resume_at
        last_position = [line, 0, 0]
        for number, chunk in enumerate(chunks):
            resuming = number == 0 and bool(self.shards)
            self.write(chunk, _resume_offset(chunk, line, sentence, tokens) if resuming else 0)
            if len(chunk.sent_line):
                last_position = [int(chunk.sent_line[-1]), int(chunk.sent_index[-1]),
                                 int(chunk.sent_lengths[-1])]
            if bar is not None:
                bar.update(len(chunk.ids))
        if bar is not None:
            bar.close()
        if self._open is not None:  # the last, partly filled shard (an open one holds tokens)
            self._finish(last_position)


def _write_int64_npy(target: Path, count: int, blocks: Iterable[bytes]) -> dict[str, str]:
    """Write ``count`` int64 values, given as raw byte blocks, atomically as a ``.npy`` file
    (plain writes, no memmap: resident memory does not grow with the corpus); its entry."""
    with atomic_path(target) as tmp, open(tmp, "wb") as handle:
        np.lib.format.write_array_header_1_0(
            handle, {"descr": np.dtype(np.int64).str, "fortran_order": False, "shape": (count,)})
        for block in blocks:
            handle.write(block)
    return {"file": target.name, "sha256": sha256_file(target)}


def _consolidate(out: Path, split: str, shards: list[dict], total: int) -> dict[str, Any]:
    """Concatenate the per-shard boundary pieces into ``SPLIT.documents.npy`` /
    ``SPLIT.sentences.npy``, with the end offset appended, one piece at a time."""
    result = {}
    for kind, name in (("docs", "documents"), ("sents", "sentences")):
        pieces = [out / s["files"][kind]["file"] for s in shards]
        count = sum(np.load(p, mmap_mode="r").shape[0] for p in pieces)
        blocks = itertools.chain((np.load(p).astype(np.int64).tobytes() for p in pieces),
                                 [np.asarray([total], dtype=np.int64).tobytes()])
        result[name] = {**_write_int64_npy(out / f"{split}.{name}.npy", count + 1, blocks),
                        "count": count}
    return result


def _consolidate_sources(out: Path, split: str, shards: list[dict]) -> dict[str, Any] | None:
    """``SPLIT.sources.npy``: each document's source code (int64, one per document) and the
    code's names; None when a shard was written without sources (an older lmlab)."""
    if not shards or not all("srcs" in shard["files"] for shard in shards):
        return None
    pieces = [out / shard["files"]["srcs"]["file"] for shard in shards]
    count = sum(np.load(p, mmap_mode="r").shape[0] for p in pieces)
    entry = _write_int64_npy(out / f"{split}.sources.npy", count,
                             (np.load(p).astype(np.int64).tobytes() for p in pieces))
    return {**entry, "names": list(shards[-1]["sources"])}


def _intact(out: Path, entry: dict) -> bool:
    """The file a manifest entry names is still there and hashes to the recorded sha256."""
    path = out / entry["file"]
    return path.exists() and sha256_file(path) == entry["sha256"]


def _verified_prefix(out: Path, shards: list[dict]) -> list[dict]:
    """The leading shards whose files still hash to what the manifest recorded."""
    return list(itertools.takewhile(
        lambda shard: all(_intact(out, f) for f in shard["files"].values()), shards))


_WORKER_ENGINE = None


def _init_worker(serialized: str) -> None:
    global _WORKER_ENGINE
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the processes are the parallelism
    _WORKER_ENGINE = engine_from_str(serialized)


def _encode_in_worker(first: int, lines: list[str]) -> EncodedChunk:
    return encode_lines(_WORKER_ENGINE, lines, first)


def _encoded_chunks(engine: Any, path: Path, start_line: int, workers: int,
                    encoding_errors: str = "strict"):
    """Encoded chunks of ``_CHUNK_DOCS`` documents (the non-empty lines of a corpus split)
    from document ``start_line`` on, in corpus order; with ``workers > 1`` a process pool
    encodes them, with at most ``2 * workers`` chunks in flight (Pool.imap would read the whole
    corpus ahead). A byte that is not UTF-8 is an error or U+FFFD (``encoding_errors``)."""
    lines = (line for _, line in iter_lines(path, sys.maxsize, errors=encoding_errors))
    documents = itertools.islice((line for line in lines if line.strip()), start_line, None)
    batches = iter(lambda: list(itertools.islice(documents, _CHUNK_DOCS)), [])
    chunks = zip(itertools.count(start_line, _CHUNK_DOCS), batches)  # (first document, lines)
    if workers <= 1:
        for first, lines in chunks:
            yield encode_lines(engine, lines, first)
        return
    import multiprocessing

    # fork: workers need no importable __main__ (scripts and notebooks work); each worker
    # rebuilds the engine from its JSON with the engine's own threads off.
    context = multiprocessing.get_context("fork")
    with context.Pool(workers, initializer=_init_worker, initargs=(engine.to_str(),)) as pool:
        pending: deque = deque()
        for first, lines in chunks:
            pending.append(pool.apply_async(_encode_in_worker, (first, lines)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def build_shards(tokenizer: Any, corpus_dir: str | os.PathLike, out_dir: str | os.PathLike,
                 shard_tokens: int = DEFAULT_SHARD_TOKENS, workers: int = 1,
                 show_progress: bool = True, overwrite: bool = False,
                 encoding_errors: str = "strict") -> dict[str, Any]:
    """Tokenize the splits of an lmlab corpus (those present, ``train`` required)
    into ``shard_tokens``-token shards in ``out_dir``; return the manifest plus
    ``"resumed_shards"``. Resuming, refusing another run's shards (unless ``overwrite``) and
    ``encoding_errors`` are described in docs/shards.md."""
    if isinstance(tokenizer, str | os.PathLike):
        tokenizer = Tokenizer.from_pretrained(tokenizer)
    check_at_least(shard_tokens, 1, "shard_tokens")
    check_encoding_errors(encoding_errors)
    corpus_dir, out = Path(corpus_dir), Path(out_dir)
    split_path(corpus_dir, "train")  # clear error when this is no corpus
    splits = [s for s in SPLITS if (corpus_dir / f"{s}.jsonl").exists()]
    if not (out / MANIFEST).exists():  # shards of ours (resumable or not) are judged below
        check_output_folder(out, overwrite, "token shards", ignore=(".*.partial",))
    header = _manifest_header(tokenizer, shard_tokens, corpus_dir)
    previous = _previous_manifest(out, header, overwrite)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob(".*.partial"):
        stale.unlink()
    manifest = {**header, "splits": {}}
    engine = plain_engine(tokenizer)
    resumed = 0
    for split in splits:
        old = previous.get(split, {})
        verified = _verified_prefix(out, old.get("shards", []))
        if old.get("complete") and len(verified) == len(old["shards"]) and all(
                _intact(out, old[k]) for k in ("documents", "sentences", "sources") if k in old):
            manifest["splits"][split] = old  # finished by an earlier run and intact
            resumed += len(verified)
            continue
        # Only full shards are resumed from; a shorter (last) shard is simply written again.
        finished = list(itertools.takewhile(lambda s: s["num_tokens"] == shard_tokens, verified))
        resumed += len(finished)

        def on_shard(shards: list[dict], split: str = split) -> None:
            manifest["splits"][split] = {"complete": False, "shards": shards}
            atomic_write_json(out / MANIFEST, manifest)

        writer = _SplitWriter(out, split, header["dtype"], shard_tokens, finished, on_shard)
        chunks = _encoded_chunks(engine, split_path(corpus_dir, split), writer.resume_at[0],
                                 workers, encoding_errors)
        writer.write_all(chunks, progress(desc=f"tokenize {split}", unit="tok", unit_scale=True)
                         if show_progress else None)
        manifest["splits"][split] = _split_entry(out, split, writer.shards, corpus_dir)
        atomic_write_json(out / MANIFEST, manifest)
    atomic_write_json(out / MANIFEST, manifest)
    return {**manifest, "resumed_shards": resumed}


def _manifest_header(tokenizer: Any, shard_tokens: int, corpus_dir: Path) -> dict[str, Any]:
    """What the shards depend on (format, dtype, shard size, tokenizer, corpus): a folder whose
    manifest differs in any of these cannot be resumed."""
    return {
        "format": FORMAT, "version": VERSION, "dtype": token_dtype(len(tokenizer)),
        "shard_tokens": shard_tokens,
        "tokenizer": {"fingerprint": tokenizer.fingerprint(), "size": len(tokenizer),
                      "family": tokenizer.family, "name_or_path": tokenizer.name_or_path,
                      "special_ids": {role: tokenizer.convert_tokens_to_ids(tok)
                                      for role, tok in tokenizer.special_tokens_map.items()}},
        "corpus": {"path": str(corpus_dir.resolve()), "hash": _corpus_hash(corpus_dir)},
    }


def _split_entry(out: Path, split: str, shards: list[dict], corpus_dir: Path) -> dict[str, Any]:
    """The manifest entry of a finished split: its shards, counts and the consolidated
    document and sentence indexes (written here). An empty train split is an error."""
    num_tokens = sum(s["num_tokens"] for s in shards)
    if num_tokens == 0 and split == "train":
        raise LmlabError(f"the {split} split of {corpus_dir} holds no tokens",
                         "build the corpus again; check that its documents have sentences")
    index = _consolidate(out, split, shards, num_tokens)
    sources = _consolidate_sources(out, split, shards)
    return {"complete": True, "num_tokens": num_tokens,
            "num_documents": index["documents"]["count"],
            "num_sentences": index["sentences"]["count"],
            "documents": index["documents"], "sentences": index["sentences"],
            **({"sources": sources} if sources else {}), "shards": shards}


def _resume_offset(chunk: EncodedChunk, line: int, sentence: int, tokens: int) -> int:
    """Offset in ``chunk`` (which starts at document ``line``) of the first token not yet
    written: after ``tokens`` tokens of sentence ``sentence`` of that document."""
    rows = np.nonzero((chunk.sent_line == line) & (chunk.sent_index == sentence))[0]
    if len(rows) == 0:
        raise LmlabError(f"the corpus changed since the shards were written (document {line} "
                         f"has no sentence {sentence})", "delete the shard folder and rebuild")
    return int(chunk.sent_starts[rows[0]]) + tokens


def _previous_manifest(out: Path, header: dict[str, Any], overwrite: bool) -> dict[str, Any]:
    """Splits of an earlier run that may be resumed; {} when there is none. Shards made with
    other settings are an error, or with ``overwrite`` are deleted (our files only)."""
    path = out / MANIFEST
    if not path.exists():
        return {}
    try:
        old = read_json(path)
    except (json.JSONDecodeError, OSError):
        old = {}
    differs = [k for k in ("format", "version", "dtype", "shard_tokens", "corpus")
               if old.get(k) != header[k]]
    if old.get("tokenizer", {}).get("fingerprint") != header["tokenizer"]["fingerprint"]:
        differs.insert(0, "tokenizer")
    if not differs:
        return old.get("splits", {})
    if not overwrite:
        raise LmlabError(f"{out} holds token shards made with another "
                         f"{' and '.join(differs)}; writing there would delete them",
                         "choose a new --out folder, or pass --overwrite to replace them")
    for split in SPLITS:  # restart cleanly: our own files only
        for pattern in (f"{split}-[0-9]*.*", f"{split}.documents.npy", f"{split}.sentences.npy",
                        f"{split}.sources.npy"):
            for stale in out.glob(pattern):
                stale.unlink()
    path.unlink()
    return {}


def _corpus_hash(corpus_dir: Path) -> str | None:
    """The corpus manifest's content hash (None without a readable manifest)."""
    try:
        manifest = read_json(corpus_dir / "manifest.json")
    except (json.JSONDecodeError, OSError):
        return None
    return next((manifest[key] for key in ("content_hash", "hash", "sha256")
                 if isinstance(manifest.get(key), str)), None)
