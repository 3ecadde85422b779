"""Build a corpus folder (train.jsonl, validation.jsonl, manifest.json) from sources, one
document at a time: exclusion, deduplication, a split by hash, atomic files, manifest last
(docs/data.md, "Building", has each step and why)."""

from __future__ import annotations

import hashlib
import os
import shutil
import warnings
from collections.abc import Iterable, Sequence
from contextlib import closing
from pathlib import Path

from lmlab.data.exclusion import SegmentExclusion, TextSet
from lmlab.text.corpus import SPLITS, Document
from lmlab.text.sentences import normalize_text
from lmlab.text.sources import BUILTIN_SOURCES, Source, SourceCounts, builtin_sources, get_source
from lmlab.text.textfile import check_encoding_errors
from lmlab.utils.checks import check_at_least, check_names, check_output_folder
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import atomic_write_json, sha256_file
from lmlab.utils.progress import progress

MANIFEST_VERSION = 1
TMP_DIRNAME = ".tmp-build"
# ----------------------------------------------------------------------------- listing

def list_sources(count: bool = True) -> list[dict]:
    """One row per built-in source: name, description, installed, counts, install hint.
    Counts are cached until the files change (docs/data.md); ``count=False`` skips them."""
    rows = []
    for source in builtin_sources():
        installed = source.is_available()
        counts = source.counts() if (installed and count) else None
        rows.append({"name": source.name, "description": source.description,
                     "installed": installed,
                     **{key: getattr(counts, key) if counts else None
                        for key in ("documents", "sentences", "words")},
                     "install_hint": "" if installed else source.install_hint})
    return rows


# ----------------------------------------------------------------------------- exclusion

ALL_TASKS = "all"


def task_exclusion_names(exclude_tasks: str | Sequence[str]) -> list[str]:
    """Built-in task names from ``"all"``, ``"none"``, a comma-separated string or a list."""
    from lmlab.tasks.builtin import BUILTIN_TASKS

    if isinstance(exclude_tasks, str):
        exclude_tasks = [n.strip() for n in exclude_tasks.split(",") if n.strip()]
    names = list(exclude_tasks)
    if names == [ALL_TASKS]:
        return list(BUILTIN_TASKS)
    if names == ["none"]:
        return []
    check_names(names, list(BUILTIN_TASKS), "--exclude-tasks", "built-in task")
    return names


def load_exclusions(files: Sequence[str | Path] = (),
                    exclude_tasks: str | Sequence[str] = ALL_TASKS,
                    encoding_errors: str = "strict") -> SegmentExclusion:
    """The exclusion index: the dev/test texts of the built-in tasks (those whose data is
    installed, for ``"all"``) and every line of ``files``."""
    from lmlab.tasks.builtin import BUILTIN_TASKS, eval_texts
    from lmlab.text.textfile import iter_lines

    exclusion = SegmentExclusion()
    paths = [Path(f) for f in files]
    for path in paths:  # every file is checked before the slow task loading
        if not path.is_file():
            raise LmlabError(f"exclude file {path} does not exist",
                             "give a text file with one text to exclude per line")
    requested = exclude_tasks != ALL_TASKS
    for name in task_exclusion_names(exclude_tasks):
        try:
            BUILTIN_TASKS[name][1]()  # its source files: raises when not installed
        except LmlabError:
            if requested:
                raise
            continue  # "all": a task whose data is missing cannot leak either
        exclusion.add(TextSet(f"task:{name}", "task", details={"splits": ["dev", "test"]}),
                      eval_texts([name], ("dev", "test"), "full"))
    for path in paths:
        lines = (line or "" for _, line in iter_lines(path, errors=encoding_errors))
        exclusion.add(TextSet(str(path), "file", details={"file_sha256": sha256_file(path)}),
                      lines)
    return exclusion


# ----------------------------------------------------------------------------- split & dedup

def _words(sentences: list[str]) -> int:
    return sum(len(s.split()) for s in sentences)


def assign_split(text: str, seed: int, validation_fraction: float) -> str:
    """``"validation"`` for a ``validation_fraction`` share of texts, chosen by SHA-256 of the
    seed and the normalised text (stable across runs, machines and source order)."""
    digest = hashlib.sha256(f"{seed}\n".encode() + text.encode("utf-8")).digest()
    position = int.from_bytes(digest[:8], "big") / 2.0**64
    return "validation" if position < validation_fraction else "train"


# ----------------------------------------------------------------------------- build

def resolve_sources(sources: str | Iterable[str | Source] | None) -> list[Source]:
    """Source objects from names/specs (a comma-separated string or a list); None = default."""
    if sources is None:  # the default corpus: every installed built-in source
        names = [source.name for source in builtin_sources() if source.is_available()]
        if not names:
            raise LmlabError("no corpus source is installed",
                             "install the Debian packages (`make setup`) or give "
                             "--sources folder:PATH / jsonl:PATH")
        sources = names
    if isinstance(sources, str):
        sources = [s for s in sources.split(",") if s.strip()]
    resolved = [s if isinstance(s, Source) else get_source(s) for s in sources]
    if not resolved:
        raise LmlabError("no sources given", f"name some of: {', '.join(BUILTIN_SOURCES)}")
    names = [s.name for s in resolved]
    if len(set(names)) != len(names):
        raise LmlabError(f"a source is named twice in {', '.join(names)}", "name each once")
    for source in resolved:
        source.require()
    return resolved


def build_corpus(sources: str | Iterable[str | Source] | None, out: str | Path,
                 exclude: Sequence[str | Path] = (), validation_fraction: float = 0.01,
                 seed: int = 0, max_documents: int | None = None,
                 exclude_tasks: str | Sequence[str] = ALL_TASKS, overwrite: bool = False,
                 encoding_errors: str = "strict") -> dict:
    """Build a corpus folder ``out`` from ``sources`` (names, specs such as ``folder:PATH``, or
    Source objects; None = every installed built-in source) and return its manifest. The
    options are the ``lmlab data build`` flags (docs/data.md, "Building")."""
    _check_settings(validation_fraction, max_documents, encoding_errors)
    out = Path(out)
    check_output_folder(out, overwrite, "corpus", ignore=(TMP_DIRNAME,))
    resolved = resolve_sources(sources)
    for source in resolved:  # user files (folder:, jsonl:) decide what a bad byte does
        if hasattr(source, "encoding_errors"):
            source.encoding_errors = encoding_errors
    exclusions = load_exclusions(exclude, exclude_tasks, encoding_errors)
    new = [folder for folder in (out, *out.parents) if not folder.exists()]  # innermost first
    tmp = _start_build_folder(out)
    try:
        with closing(_CorpusWriter(tmp, seed, validation_fraction)) as writer:
            per_source = {source.name: _write_source(source, writer, exclusions, max_documents)
                          for source in resolved}
        totals = _split_totals(per_source, resolved, validation_fraction)
        settings = {"sources": [s.name for s in resolved],
                    "validation_fraction": validation_fraction, "seed": seed,
                    "max_documents": max_documents, "exclude": [str(p) for p in exclude],
                    "exclude_tasks": [s.name.removeprefix("task:")
                                      for s in exclusions.sets if s.kind == "task"]}
        manifest = _manifest(per_source, totals, writer, exclusions, settings)
        for split in SPLITS:
            os.replace(tmp / f"{split}.jsonl", out / f"{split}.jsonl")
        atomic_write_json(out / "manifest.json", manifest)  # last: the folder is complete
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        for folder in new:  # a failed build leaves no folder behind
            if not any(folder.iterdir()):
                folder.rmdir()
    return manifest


def _check_settings(validation_fraction: float, max_documents: int | None,
                    encoding_errors: str) -> None:
    """Refuse bad numbers before any source is read."""
    if not 0.0 <= validation_fraction < 1.0:
        raise LmlabError(f"validation fraction {validation_fraction} is not in [0, 1)",
                         "use e.g. --validation-fraction 0.01")
    check_at_least(max_documents, 1, "--max-documents")
    check_encoding_errors(encoding_errors)


def _start_build_folder(out: Path) -> Path:
    """Create ``out``, delete its manifest (the folder is incomplete until the build ends) and
    return a fresh, empty ``out/.tmp-build`` to write the split files into."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").unlink(missing_ok=True)
    tmp = out / TMP_DIRNAME
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    return tmp


class _CorpusWriter:
    """Writes the kept documents to ``train.jsonl`` / ``validation.jsonl``: drops exact
    duplicates (a 16-byte digest of every text written, from any source, is all it keeps in
    memory), picks each document's split, and keeps each file's running SHA-256 and byte count
    (so the manifest needs no second read of the corpus)."""

    def __init__(self, folder: Path, seed: int, validation_fraction: float):
        self.seed, self.validation_fraction = seed, validation_fraction
        self.seen: set[bytes] = set()
        self.hashers = {split: hashlib.sha256() for split in SPLITS}
        self.sizes = dict.fromkeys(SPLITS, 0)
        self.handles = {split: open(folder / f"{split}.jsonl", "wb") for split in SPLITS}

    def add(self, record: Document) -> str | None:
        """Write ``record`` as one JSON line to its split's file and return the split; None
        (nothing written) when the same text was written before."""
        text = " ".join(record.sentences)
        digest = hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()
        if digest in self.seen:
            return None
        self.seen.add(digest)
        split = assign_split(text, self.seed, self.validation_fraction)
        line = (record.to_json() + "\n").encode("utf-8")
        self.handles[split].write(line)
        self.hashers[split].update(line)
        self.sizes[split] += len(line)
        return split

    def close(self) -> None:
        for handle in self.handles.values():
            handle.close()


def _write_source(source: Source, writer: _CorpusWriter, exclusions: SegmentExclusion,
                  max_documents: int | None) -> dict:
    """Stream one source's documents through normalisation, exclusion, deduplication and the
    split into ``writer``; return the source's manifest entry (counts read, dropped, and
    written per split)."""
    stats = {split: SourceCounts() for split in SPLITS}
    dropped = {"read": 0, "duplicates": 0, "excluded": 0, "excluded_sentences": 0,
               "excluded_words": 0}
    raw = SourceCounts()
    cached = source.cached_counts()  # the bar's total: the cached count, capped by max_documents
    total = min(filter(None, (cached.documents if cached else None, max_documents)), default=None)
    bar = progress(desc=source.name, total=total, unit="doc")
    complete = True
    for number, document in enumerate(source.iter_documents()):
        if max_documents is not None and number >= max_documents:
            complete = False
            break
        bar.update(1)
        raw.add(document)
        sentences = _kept_sentences(document, exclusions, dropped)
        if not sentences:
            continue
        record = Document(document.id, document.source, sentences)
        split = writer.add(record)
        if split is None:
            dropped["duplicates"] += 1
        else:
            stats[split].add(record)
    bar.close()
    if complete:
        source.store_counts(raw)  # makes the next `lmlab data list` instant
    return {**dropped, **{split: vars(counts) for split, counts in stats.items()}}


def _kept_sentences(document: Document, exclusions: SegmentExclusion,
                    counts: dict[str, int]) -> list[str]:
    """The document's normalised sentences minus the excluded segments ([] = drop it), counting
    in ``counts`` the documents read and the documents, sentences and words excluded."""
    sentences = [s for s in map(normalize_text, document.sentences) if s]  # NFC, one space
    if not sentences:
        return []
    counts["read"] += 1
    if not exclusions:
        return sentences
    kept = exclusions.filter(sentences)
    if kept is not sentences:
        counts["excluded_sentences"] += len(sentences) - len(kept)
        counts["excluded_words"] += _words(sentences) - _words(kept)
    if not kept:
        counts["excluded"] += 1
    return kept


def _split_totals(per_source: dict[str, dict], sources: list[Source],
                  validation_fraction: float) -> dict[str, SourceCounts]:
    """Documents, sentences and words written to each split, summed over the sources. An empty
    corpus is refused; an empty validation split, when one was asked for, is a warning."""
    totals = {split: SourceCounts(**{key: sum(entry[split][key] for entry in per_source.values())
                                     for key in ("documents", "sentences", "words")})
              for split in SPLITS}
    total_documents = totals["train"].documents + totals["validation"].documents
    if total_documents == 0:
        raise LmlabError(
            "the corpus is empty: no documents left after reading, exclusion and "
            f"deduplication (sources: {', '.join(s.name for s in sources)})",
            "check the sources hold text and that the excluded texts do not cover them")
    if totals["validation"].documents == 0 and validation_fraction > 0:
        warnings.warn(f"no document landed in validation (fraction {validation_fraction} "
                      f"of {total_documents} documents); raise --validation-fraction",
                      stacklevel=3)  # build_corpus's caller
    return totals


def _manifest(per_source: dict[str, dict], totals: dict[str, SourceCounts], writer: _CorpusWriter,
              exclusions: SegmentExclusion, settings: dict) -> dict:
    """The corpus manifest: counts per source and split, what was excluded, the files' hashes
    and sizes, one hash over both files, and the settings that made the corpus."""
    file_hashes = {split: writer.hashers[split].hexdigest() for split in SPLITS}
    return {
        "format": "lmlab-corpus",
        "version": MANIFEST_VERSION,
        "sources": per_source,
        "splits": {split: vars(counts) for split, counts in totals.items()},
        "total_words": totals["train"].words + totals["validation"].words,
        "total_documents": totals["train"].documents + totals["validation"].documents,
        "duplicates_removed": sum(e["duplicates"] for e in per_source.values()),
        "exclude": exclusions.summary(),
        "excluded_documents": sum(e["excluded"] for e in per_source.values()),
        "excluded_sentences": sum(e["excluded_sentences"] for e in per_source.values()),
        "excluded_words": sum(e["excluded_words"] for e in per_source.values()),
        "files": {f"{split}.jsonl": {"sha256": file_hashes[split], "bytes": writer.sizes[split]}
                  for split in SPLITS},
        # one hash over both files' hashes: equal corpora have equal sha256
        "sha256": hashlib.sha256(
            f"train:{file_hashes['train']}\nvalidation:{file_hashes['validation']}\n"
            .encode()).hexdigest(),
        "settings": settings,
    }
