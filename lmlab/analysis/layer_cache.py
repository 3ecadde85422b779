"""Every layer's word vectors, extracted once per text and cached on disk (probing trains dozens
of classifiers on the same frozen vectors). A word is the mean of the pieces whose character
offsets overlap its span, so words may come from any word splitter; the cache key is the model's
and tokenizer's fingerprint and a hash of the texts and spans; words past a truncation cut get
no vector (docs/probing.md, "Features").
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from lmlab.analysis.features import run_texts
from lmlab.models.inputs import input_limit
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import atomic_write_json, read_json, stable_hash

CACHE_VERSION = 2  # 2: the key holds the model's config and input limit


@dataclass
class WordRequest:
    """One text and the character spans of the words whose vectors are wanted."""

    text: str
    spans: list[tuple[int, int]]


@dataclass
class ExtractionStats:
    """What extraction did: texts, words, and what truncation or alignment dropped."""

    texts: int = 0
    words: int = 0
    truncated_texts: int = 0
    words_past_cut: int = 0
    unaligned_words: int = 0
    max_length: int = 0

    def warning(self) -> str | None:
        """A sentence for the user when words were lost, else None."""
        parts = []
        if self.truncated_texts:
            parts.append(f"{self.truncated_texts} text(s) were longer than the model's maximum "
                         f"of {self.max_length} tokens and were truncated: "
                         f"{self.words_past_cut} word(s) past the cut were dropped")
        if self.unaligned_words:
            parts.append(f"{self.unaligned_words} word(s) matched no token of the tokenizer "
                         "(characters it drops) and were dropped")
        return "; ".join(parts) or None


@dataclass
class WordFeatures:
    """Cached word vectors: ``array`` (rows, L+1, H) float32 memory map, one row per requested
    word in request order; ``valid[row]`` is False for a word that got no vector."""

    array: np.ndarray
    valid: np.ndarray
    offsets: np.ndarray  # (texts + 1,): text i's words are rows offsets[i]:offsets[i+1]
    stats: ExtractionStats
    folder: Path
    from_cache: bool

    def row(self, text: int, word: int) -> int:
        return int(self.offsets[text]) + word


def word_rows(words: Iterable[tuple[str, tuple[int, int]]]
              ) -> tuple[list[WordRequest], dict[tuple[str, tuple[int, int]], int]]:
    """One request per distinct text of ``words`` ((text, span) pairs), its distinct spans in
    text order, and each word's row among the requests' rows (a word asked twice: one row)."""
    spans: dict[str, set[tuple[int, int]]] = {}
    for text, span in words:
        spans.setdefault(text, set()).add(span)
    requests = [WordRequest(text, sorted(found)) for text, found in spans.items()]
    pairs = [(request.text, span) for request in requests for span in request.spans]
    return requests, {pair: row for row, pair in enumerate(pairs)}


def model_fingerprint(model: torch.nn.Module, tokenizer) -> str:
    """SHA-256 over the model's parameter names, shapes and bytes, its config and the tokenizer:
    two models share cached features only when they compute the same vectors."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        data = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{tuple(data.shape)}:{data.dtype}".encode())
        digest.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    digest.update(repr(model.config).encode())  # settings that are not weights (eps, act, ...)
    digest.update(tokenizer.fingerprint().encode())
    return digest.hexdigest()


def _align(offsets: list[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> list[list[int]]:
    """For each word span, the positions of the pieces overlapping it (offsets sorted by start;
    special tokens have empty offsets and are skipped)."""
    pieces = [(s, e, p) for p, (s, e) in enumerate(offsets) if e > s]
    result = []
    first = 0
    for start, end in spans:
        while first < len(pieces) and pieces[first][1] <= start:
            first += 1
        found, cursor = [], first
        while cursor < len(pieces) and pieces[cursor][0] < end:
            if pieces[cursor][1] > start:
                found.append(pieces[cursor][2])
            cursor += 1
        result.append(found)
    return result


@torch.inference_mode()
def extract_word_features(model, tokenizer, requests: Sequence[WordRequest], out: np.ndarray,
                          batch_size: int = 32, max_length: int | None = None,
                          valid: np.ndarray | None = None) -> ExtractionStats:
    """Fill ``out`` (rows, L+1, H) with every layer's mean-of-pieces vector of each requested
    word (rows in request order), batch by batch; ``valid[row]`` is set False for words past the
    truncation cut or matching no piece. Texts are batched by length (less padding)."""
    model.eval()
    max_length = input_limit(model, tokenizer, max_length)
    stats = ExtractionStats(texts=len(requests), max_length=max_length)
    offsets = np.cumsum([0] + [len(r.spans) for r in requests])
    stats.words = int(offsets[-1])
    order = sorted(range(len(requests)), key=lambda i: len(requests[i].text))
    for begin in range(0, len(order), batch_size):
        chunk = order[begin:begin + batch_size]
        # right padding: positions count from each row's first token, whatever side the
        # tokenizer pads by default (a decoder's left padding would shift absolute positions)
        batch, hidden = run_texts(model, tokenizer, [requests[i].text for i in chunk],
                                  max_length, padding_side="right")  # L+1 tensors (B, T, H)
        width = hidden[0].shape[1]
        positions, rows, counts, row_ids = [], [], [], []
        for b, index in enumerate(chunk):
            request = requests[index]
            mapping = [tuple(x) for x in batch["offset_mapping"][b].tolist()]
            kept_end = max((e for s, e in mapping if e > s), default=0)
            cut = kept_end < len(request.text.rstrip())
            for w, pieces in enumerate(_align(mapping, request.spans)):
                row = int(offsets[index]) + w
                if not pieces:
                    if cut and request.spans[w][0] >= kept_end:
                        stats.words_past_cut += 1
                    else:
                        stats.unaligned_words += 1
                    if valid is not None:
                        valid[row] = False
                    continue
                positions += [b * width + p for p in pieces]
                rows += [len(row_ids)] * len(pieces)
                counts.append(len(pieces))
                row_ids.append(row)
            if cut and any(s >= kept_end for s, _ in request.spans):
                stats.truncated_texts += 1
        if not row_ids:
            continue
        # Only the requested pieces are gathered, layer by layer (no (L+1, B, T, H) copy).
        positions_t, rows_t = torch.tensor(positions), torch.tensor(rows)
        scale = 1.0 / torch.tensor(counts, dtype=torch.float32)[:, None]  # (words, 1)
        pooled = np.empty((len(row_ids), len(hidden), hidden[0].shape[-1]), dtype=np.float32)
        for layer, states in enumerate(hidden):
            pieces = states.flatten(0, 1)[positions_t].float()  # (pieces, H)
            sums = pieces.new_zeros(len(row_ids), pieces.shape[-1]).index_add_(0, rows_t, pieces)
            pooled[:, layer] = (sums * scale).cpu().numpy()
        out[np.asarray(row_ids)] = pooled  # (words, L+1, H)
    return stats


def data_hash(requests: Sequence[WordRequest]) -> str:
    """Hash of the texts and word spans (what the cached rows are of)."""
    digest = hashlib.sha256()
    for request in requests:
        digest.update(request.text.encode("utf-8"))
        digest.update(repr(list(request.spans)).encode())
    return digest.hexdigest()


def cached_word_features(model, tokenizer, requests: Sequence[WordRequest], cache_root: Path,
                         batch_size: int = 32, fingerprint: str | None = None) -> WordFeatures:
    """Word vectors of every layer for ``requests``, from ``cache_root`` when a previous call
    cached them for the same model and data, else extracted and cached (``.npy`` memory map
    written batch by batch, renamed into place when complete)."""
    if not requests:
        raise LmlabError("no words to extract vectors for", "give at least one labelled word")
    fingerprint = fingerprint or model_fingerprint(model, tokenizer)
    # the truncation point decides which words get vectors
    key = stable_hash([CACHE_VERSION, fingerprint, data_hash(requests),
                       input_limit(model, tokenizer)])
    folder = Path(cache_root) / key
    offsets = np.cumsum([0] + [len(r.spans) for r in requests])
    meta_path = folder / "meta.json"
    if meta_path.is_file():
        meta = read_json(meta_path)
        return WordFeatures(np.load(folder / "features.npy", mmap_mode="r"),
                            np.load(folder / "valid.npy"), offsets,
                            ExtractionStats(**meta["stats"]), folder, from_cache=True)
    shape = (int(offsets[-1]), model.config.num_hidden_layers + 1, model.config.hidden_size)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    array = np.lib.format.open_memmap(partial / "features.npy", mode="w+", dtype=np.float32,
                                      shape=shape)
    valid = np.ones(shape[0], dtype=bool)
    stats = extract_word_features(model, tokenizer, requests, array, batch_size, valid=valid)
    array.flush()
    del array
    np.save(partial / "valid.npy", valid)
    atomic_write_json(partial / "meta.json", {"shape": list(shape), "stats": asdict(stats),
                                              "model": fingerprint, "version": CACHE_VERSION})
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return WordFeatures(np.load(folder / "features.npy", mmap_mode="r"), valid, offsets, stats,
                        folder, from_cache=False)
