"""From token shards to corrupted pretraining batches: packing, segment pairs, shuffling,
workers, exact resume. Every random choice derives from (seed, epoch, unit) or (seed, batch
number), never from the worker (docs/objectives.md, "The data stream")."""

from __future__ import annotations

import functools
import itertools
import os
import random
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmlab.data.shard_reader import ShardReader, TokenSource
from lmlab.data.shards import encode_sentences, plain_engine
from lmlab.utils.checks import check_at_least, check_choice
from lmlab.utils.errors import LmlabError

FORMATS = ("packed", "segment_pairs")
PACKINGS = ("full_sentences", "doc_sentences", "doc_windows")
PAIR_LABEL_KEYS = {"nsp": "next_sentence_label", "sop": "sentence_order_label"}
_SEED_MOD = 2**63 - 1
_PAIR_ID_BITS = 20  # example id of a segment pair: (document << 20) | index within document


# ------------------------------------------------------------------------------------ sources
class InMemoryTokenSource(TokenSource):
    """A :class:`TokenSource` held in memory (small corpora, tests, notebooks), from tokenized
    sentences (:meth:`from_sentences`) or text and a tokenizer (:meth:`from_texts`)."""

    def __init__(self, ids: np.ndarray, word_starts: np.ndarray, sentence_offsets: np.ndarray,
                 document_offsets: np.ndarray, vocab_size: int | None = None,
                 sources: tuple[Sequence[int], Sequence[str]] | None = None):
        self._arrays = (np.asarray(ids, dtype=np.int64), np.asarray(word_starts, dtype=np.uint8))
        super().__init__([len(self._arrays[0])], np.asarray(document_offsets, dtype=np.int64),
                         np.asarray(sentence_offsets, dtype=np.int64))
        self.vocab_size = vocab_size
        if len(self._arrays[1]) != self.num_tokens or self._documents[-1] != self.num_tokens:
            raise LmlabError("token, word-start and document arrays disagree in length",
                             "build it with InMemoryTokenSource.from_sentences")
        if sources is not None:  # (code of each document, names of the codes)
            self._sources = (np.asarray(sources[0], dtype=np.int64), list(sources[1]))

    def _shard(self, index: int, words: bool) -> np.ndarray:
        return self._arrays[words]

    @classmethod
    def from_sentences(cls, documents: Sequence[Sequence[tuple[Sequence[int], Sequence[bool]]]],
                       vocab_size: int | None = None,
                       sources: Sequence[str] | None = None) -> InMemoryTokenSource:
        """From documents given as lists of ``(ids, word_starts)`` sentences (empty ones are
        dropped; documents left empty are dropped too), each from the source ``sources`` names
        (optional)."""
        ids, words, sentence_offsets, document_offsets = [], [], [0], [0]
        total, kept_sources = 0, []
        for number, document in enumerate(documents):
            kept = 0
            for sentence_ids, starts in document:
                if len(sentence_ids) == 0:
                    continue
                ids.append(np.asarray(sentence_ids, dtype=np.int64))
                words.append(np.asarray(starts, dtype=bool))
                total += len(sentence_ids)
                sentence_offsets.append(total)
                kept += 1
            if kept:
                document_offsets.append(total)
                kept_sources.append(None if sources is None else sources[number])
        if total == 0:
            raise LmlabError("no tokens in the given documents", "pass non-empty documents")
        names = sorted(set(kept_sources)) if sources is not None else []
        return cls(np.concatenate(ids), np.concatenate(words), np.asarray(sentence_offsets),
                   np.asarray(document_offsets), vocab_size,
                   None if sources is None else ([names.index(n) for n in kept_sources], names))

    @classmethod
    def from_texts(cls, documents: Sequence[Sequence[str]], tokenizer: Any,
                   sources: Sequence[str] | None = None) -> InMemoryTokenSource:
        """Tokenize documents (lists of sentences) with an ``lmlab.Tokenizer`` or a
        ``tokenizers.Tokenizer``, without special tokens, as the shards are; ``sources``: each
        document's source name (optional)."""
        engine = plain_engine(tokenizer)
        ids, starts, lengths = encode_sentences(engine, [s for d in documents for s in d])
        cuts = np.cumsum(lengths)[:-1]
        sentences = list(zip(np.split(ids, cuts), np.split(starts, cuts)))
        ends = np.cumsum([0, *(len(document) for document in documents)])
        return cls.from_sentences([sentences[a:b] for a, b in zip(ends[:-1], ends[1:])],
                                  engine.get_vocab_size(with_added_tokens=True), sources)


def open_source(source: str | os.PathLike | TokenSource, split: str) -> TokenSource:
    """A TokenSource from a shard folder path (or the source itself)."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.exists():
            raise LmlabError(f"shard folder {path} does not exist",
                             "tokenize a corpus first: lmlab data tokenize --out DIR ...")
        return ShardReader(path, split)
    if isinstance(source, TokenSource):
        return source
    raise LmlabError(f"cannot read tokens from a {type(source).__name__}",
                     "pass a shard folder or a TokenSource (e.g. InMemoryTokenSource)")


def pad_rows(rows: Sequence[Sequence[Any]], fill: Any, width: int | None = None,
             dtype: Any = np.int64) -> np.ndarray:
    """Rows of different lengths right-padded with ``fill`` to ``width`` columns (default: the
    longest row, at least 1): (B, width)."""
    width = max(max((len(row) for row in rows), default=0), 1) if width is None else width
    out = np.full((len(rows), width), fill, dtype=dtype)
    for index, row in enumerate(rows):
        out[index, :len(row)] = row
    return out


# ------------------------------------------------------------------------------ segment pairs
Sentence = tuple[np.ndarray, np.ndarray]  # (ids, word_starts)


@dataclass
class SegmentPair:
    """One ``[CLS] A [SEP] B [SEP]`` instance before special tokens are added."""

    tokens_a: np.ndarray
    starts_a: np.ndarray
    tokens_b: np.ndarray
    starts_b: np.ndarray
    label: int  # NSP: 1 = B is random; SOP: 1 = swapped


def truncate_seq_pair(a: list[int], b: list[int], max_num_tokens: int,
                      rng: random.Random) -> tuple[slice, slice]:
    """BERT's ``truncate_seq_pair`` on lengths: drop a token from the front or the back (50/50)
    of the longer segment until both fit. Returns the slices to keep of A and B."""
    a_lo, a_hi, b_lo, b_hi = 0, len(a), 0, len(b)
    while (a_hi - a_lo) + (b_hi - b_lo) > max_num_tokens:
        if (a_hi - a_lo) > (b_hi - b_lo):
            if rng.random() < 0.5:
                a_lo += 1
            else:
                a_hi -= 1
        elif rng.random() < 0.5:
            b_lo += 1
        else:
            b_hi -= 1
    return slice(a_lo, a_hi), slice(b_lo, b_hi)


def _join(sentences: Sequence[Sentence]) -> tuple[np.ndarray, np.ndarray]:
    if not sentences:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
    return (np.concatenate([s[0] for s in sentences]),
            np.concatenate([s[1] for s in sentences]))


Pair = tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray], int]  # A, B, label


def _nsp_pair(chunk: list[Sentence], a_end: int, target: int, document_index: int,
              num_documents: int, fetch_document: Callable[[int], Sequence[Sentence]],
              rng: random.Random) -> tuple[Pair, int]:
    """BERT's NSP pair of a chunk: B continues A (0), or starts in a random other document (1;
    always for a one-sentence chunk), and the chunk's sentences then unused, to put back."""
    a = _join(chunk[:a_end])
    if len(chunk) > 1 and rng.random() >= 0.5:
        return (a, _join(chunk[a_end:]), 0), 0
    other = document_index
    for _ in range(10):
        other = rng.randint(0, num_documents - 1)
        if other != document_index:
            break
    random_document = fetch_document(other)
    b: list[Sentence] = []
    b_length = 0
    for j in range(rng.randint(0, len(random_document) - 1), len(random_document)):
        b.append(random_document[j])
        b_length += len(random_document[j][0])
        if b_length >= target - len(a[0]):
            break
    return (a, _join(b), 1), len(chunk) - a_end


def _sop_pair(chunk: list[Sentence], a_end: int, rng: random.Random) -> Pair | None:
    """ALBERT's SOP pair of a chunk: two consecutive segments in order (0) or swapped (1); a
    one-sentence chunk is cut inside the sentence (None when it has one token)."""
    if len(chunk) >= 2:
        a, b = _join(chunk[:a_end]), _join(chunk[a_end:])
    elif len(chunk[0][0]) >= 2:
        cut = rng.randint(1, len(chunk[0][0]) - 1)
        ids, starts = chunk[0]
        a, b = (ids[:cut], starts[:cut]), (ids[cut:], starts[cut:])
    else:
        return None
    return (b, a, 1) if rng.random() < 0.5 else (a, b, 0)


def create_segment_pairs(document: Sequence[Sentence], document_index: int, num_documents: int,
                         fetch_document: Callable[[int], Sequence[Sentence]],
                         max_num_tokens: int, mode: str, rng: random.Random,
                         short_seq_prob: float = 0.1) -> list[SegmentPair]:
    """Segment pairs of one document, as BERT's ``create_instances_from_document`` (NSP) or
    ALBERT's sentence-order variant (SOP), each cut to ``max_num_tokens`` by
    :func:`truncate_seq_pair` (docs/objectives.md, "Next-sentence / sentence-order prediction")."""
    check_choice(mode, PAIR_LABEL_KEYS, "mode", "segment-pair mode")
    target = max_num_tokens
    if rng.random() < short_seq_prob:
        target = rng.randint(2, max_num_tokens)
    pairs: list[SegmentPair] = []
    chunk: list[Sentence] = []
    length, i = 0, 0
    while i < len(document):
        chunk.append(document[i])
        length += len(document[i][0])
        if i == len(document) - 1 or length >= target:
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            if mode == "nsp":
                pair, put_back = _nsp_pair(chunk, a_end, target, document_index, num_documents,
                                           fetch_document, rng)
                i -= put_back
            else:
                pair = _sop_pair(chunk, a_end, rng)
            if pair is not None and len(pair[0][0]) and len(pair[1][0]):
                (a_ids, a_starts), (b_ids, b_starts), label = pair
                keep_a, keep_b = truncate_seq_pair(a_ids, b_ids, max_num_tokens, rng)
                pairs.append(SegmentPair(a_ids[keep_a], a_starts[keep_a], b_ids[keep_b],
                                         b_starts[keep_b], label))
            chunk, length = [], 0
        i += 1
    return pairs


# ------------------------------------------------------------------------------------- stream
@dataclass
class _Position:
    """Where the stream is: the next example is example ``offset`` of block ``block`` of
    epoch ``epoch``; ``batches`` batches and ``tokens_seen`` real tokens were yielded so far.
    A mixed stream instead counts its ``drawn`` examples and, per source, the units taken and
    the examples taken of the current one (``cursors``)."""

    epoch: int = 0
    block: int = 0
    offset: int = 0
    batches: int = 0
    tokens_seen: int = 0
    drawn: int = 0
    cursors: list[list[int]] | None = None


def _seed_of(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) % _SEED_MOD for p in parts]).generate_state(
        2, np.uint64)[0] % _SEED_MOD)


class PretrainingStream:
    """An iterable of corrupted pretraining batches (dicts of tensors) over a shard folder's
    split or a :class:`TokenSource`: the objective's ``example_format`` picks packed windows or
    segment pairs, its ``corrupt`` makes inputs and targets. The arguments and batch keys are
    in docs/objectives.md ("The data stream"); any ``workers`` gives the same batches."""

    def __init__(self, shards_dir: str | os.PathLike | TokenSource, split: str = "train",
                 objective: Any = None, batch_size: int = 32, seq_len: int = 128,
                 seed: int = 0, workers: int = 0, packing: str = "full_sentences",
                 format: str | None = None, shuffle: bool | None = None,
                 infinite: bool | None = None, short_seq_prob: float = 0.1,
                 shuffle_block: int = 64, token_type_ids: bool = True,
                 mix: str | dict[str, float] | None = None,
                 batch_ramp: tuple[int, int] | None = None, batch_multiple: int = 1):
        if objective is None:
            raise LmlabError("PretrainingStream needs an objective",
                             "build one: build_objective('mlm', SpecialTokens.from_tokenizer(tok))")
        self.source = open_source(shards_dir, split)
        self.split = split
        self.objective = objective
        self.special = objective.special
        self.batch_size = int(batch_size)
        self.seq_len = int(seq_len)
        self.seed = int(seed)
        self.workers = max(0, int(workers))
        self.format = format or getattr(objective, "example_format", "packed")
        self.packing = packing
        self.shuffle = (split == "train") if shuffle is None else bool(shuffle)
        self.infinite = (split == "train") if infinite is None else bool(infinite)
        self.short_seq_prob = float(short_seq_prob)
        self.shuffle_block = max(1, int(shuffle_block))
        self.emit_types = bool(token_type_ids)
        self.cls_sep = getattr(objective, "cls_sep_packing", True)
        # BART's sentence permutation reads where the shards' sentences start
        self.sentence_starts = bool(getattr(objective, "uses_sentence_starts", False))
        self.pair_mode = getattr(objective, "pair_mode", "") or "nsp"
        self._check()
        self._documents = np.asarray(self.source.document_offsets(), dtype=np.int64)
        if self.sentence_starts:
            self._sentence_offsets = np.asarray(self.source.sentence_offsets(), dtype=np.int64)
        if self.format == "segment_pairs":
            self.num_units = self.source.num_documents
            self.block_units = self.shuffle_block
        else:
            self._build_windows()
            self.block_units = 256
        if self.num_units == 0:
            raise LmlabError(f"the {split} split holds no complete example "
                             f"(seq_len {self.seq_len})",
                             "use more data or a shorter --seq-len")
        self.num_blocks = -(-self.num_units // self.block_units)
        self._position = _Position()
        self.mixture = self._mixture(mix) if mix else None
        self.batch_ramp = None if batch_ramp is None else tuple(int(n) for n in batch_ramp)
        self.batch_multiple = max(1, int(batch_multiple))
        self.tokens_before = 0  # tokens of earlier phases (lmlab.data.phases), for the ramp

    # -- set-up ---------------------------------------------------------------------------------
    def _check(self) -> None:
        check_choice(self.format, FORMATS, "format", "example format")
        check_choice(self.packing, PACKINGS, "packing", "packing")
        check_at_least(self.batch_size, 1, "batch_size")
        least = 8 if self.format == "segment_pairs" else (3 if self.cls_sep else 2)
        if self.seq_len < least:
            raise LmlabError(f"seq_len {self.seq_len} is too short for {self.format} examples",
                             f"use seq_len >= {least} (128 or 512 as BERT did)")
        if self.format == "segment_pairs":
            check_choice(self.pair_mode, PAIR_LABEL_KEYS, "pair_mode", "segment-pair mode")
        vocab = self.source.vocab_size
        if vocab is not None and vocab != self.special.vocab_size:
            raise LmlabError(f"the shards were written with a {vocab}-token vocabulary but the "
                             f"objective's tokenizer has {self.special.vocab_size}",
                             "build the objective from the tokenizer the shards were made with")

    def _mixture(self, mix: str | dict[str, float]) -> Any:
        """The :class:`~lmlab.data.mixture.SourceMixture` of the units' sources (a packed
        window's is that of the document it starts in)."""
        from lmlab.data.mixture import SourceMixture, check_mix, parse_mix

        weights = parse_mix(mix)
        recorded = self.source.document_sources()
        check_mix(weights, None if recorded is None else recorded[1], f"the {self.split} split")
        if not self.infinite:
            raise LmlabError("a source mixture samples an endless stream",
                             "mix the training split only (infinite=True)")
        codes, names = recorded
        if self.format == "segment_pairs":
            documents = np.arange(self.num_units)
        elif self.packing == "full_sentences":  # the document of each window's first position
            documents = np.searchsorted(self._separators, np.arange(self.num_units)
                                        * self.content_length, side="left")
        else:
            documents = np.searchsorted(self._documents, self._unit_start, side="right") - 1
        return SourceMixture(np.asarray(codes)[documents], names, weights, self.seed)

    def _batch_size_at(self, position: _Position) -> int:
        """Sequences in the next batch: ``batch_size``, or GPT-3's ramp towards it."""
        if self.batch_ramp is None:
            return self.batch_size
        from lmlab.data.phases import ramped_batch_size

        return ramped_batch_size(self.tokens_before + position.tokens_seen, self.batch_size,
                                 self.seq_len, *self.batch_ramp, self.batch_multiple)

    @property
    def content_length(self) -> int:
        """Tokens of text per packed example (seq_len minus [CLS] and [SEP] for encoders)."""
        return self.seq_len - 2 if self.cls_sep else self.seq_len

    def _build_windows(self) -> None:
        """Index arrays of the packed windows (never the tokens)."""
        length = self.content_length
        docs = self._documents
        if self.packing == "full_sentences":
            virtual = int(docs[-1]) + (len(docs) - 1)  # every document followed by a separator
            # Document d occupies virtual positions [docs[d] + d, docs[d+1] + d); its separator
            # sits at docs[d+1] + d.
            self._separators = docs[1:] + np.arange(len(docs) - 1)
            self.num_units = -(-virtual // length)
            return
        starts, stops = [], []
        if self.packing == "doc_windows":
            lengths = np.diff(docs)
            counts = -(-lengths // length)
            unit_doc = np.repeat(np.arange(len(lengths)), counts)
            first_unit = np.repeat(np.cumsum(counts) - counts, counts)
            self._unit_start = docs[unit_doc] + (np.arange(len(unit_doc)) - first_unit) * length
            self._unit_stop = np.minimum(self._unit_start + length, docs[unit_doc + 1])
            self.num_units = len(self._unit_start)
            return
        sentences = np.asarray(self.source.sentence_offsets(), dtype=np.int64).tolist()
        doc_ends = set(docs[1:].tolist())
        current = None  # where the window being filled starts
        previous_end = 0
        for begin, end in zip(sentences[:-1], sentences[1:]):
            if current is not None and end - current > length:  # this sentence does not fit
                starts.append(current)
                stops.append(previous_end)
                current = None
            if end - begin > length:  # a sentence longer than a window: cut into pieces
                starts.extend(range(begin, end, length))
                stops.extend(min(piece + length, end) for piece in range(begin, end, length))
            elif current is None:
                current = begin
            previous_end = end
            if end in doc_ends and current is not None:
                starts.append(current)
                stops.append(end)
                current = None
        self._unit_start = np.asarray(starts, dtype=np.int64)
        self._unit_stop = np.asarray(stops, dtype=np.int64)
        self.num_units = len(self._unit_start)

    # -- examples -------------------------------------------------------------------------------
    def _order(self, epoch: int) -> np.ndarray:
        if self.shuffle:
            return np.random.default_rng([self.seed, epoch, 1]).permutation(self.num_units)
        return np.arange(self.num_units)

    def _sentence_starts_of(self, start: int, count: int) -> np.ndarray:
        """(count,) bool: which tokens of ``[start, start + count)`` begin a shard sentence."""
        offsets = self._sentence_offsets
        inside = offsets[np.searchsorted(offsets, start):np.searchsorted(offsets, start + count)]
        out = np.zeros(count, dtype=bool)
        out[inside - start] = True
        return out

    def _wrap(self, ids: np.ndarray, starts: np.ndarray, example_id: int,
              epoch: int, sentences: np.ndarray | None = None) -> dict[str, Any]:
        if self.cls_sep:
            ids = np.concatenate([[self.special.cls_id], ids, [self.special.sep_id]])
            starts = np.concatenate([[True], starts, [True]])
            if sentences is not None:
                sentences = np.concatenate([[False], sentences, [False]])
        example = {"ids": ids.astype(np.int64), "starts": starts.astype(bool),
                   "types": None, "example_id": example_id, "epoch": epoch}
        if sentences is not None:
            example["sentences"] = sentences.astype(bool)
        return example

    def _separator(self) -> int:
        if self.cls_sep:
            return self.special.sep_id
        return self.special.eos_id if self.special.eos_id is not None else self.special.sep_id

    def _packed_example(self, unit: int, epoch: int) -> dict[str, Any]:
        length = self.content_length
        if self.packing != "full_sentences":
            start, stop = int(self._unit_start[unit]), int(self._unit_stop[unit])
            return self._wrap(self.source.window(start, stop - start),
                              self.source.word_starts(start, stop - start), unit, epoch,
                              self._sentence_starts_of(start, stop - start)
                              if self.sentence_starts else None)
        docs, separators = self._documents, self._separators
        begin, end = unit * length, (unit + 1) * length
        doc = int(np.searchsorted(separators, begin, side="left"))
        ids_parts, start_parts, sentence_parts = [], [], []
        while doc < len(docs) - 1:
            virtual_start = int(docs[doc]) + doc
            if virtual_start >= end:
                break
            low, high = max(begin, virtual_start), min(end, int(separators[doc]))
            if high > low:
                real = int(docs[doc]) + (low - virtual_start)
                ids_parts.append(self.source.window(real, high - low))
                start_parts.append(self.source.word_starts(real, high - low))
                if self.sentence_starts:
                    sentence_parts.append(self._sentence_starts_of(real, high - low))
            if begin <= int(separators[doc]) < end:  # ends its document's last sentence
                ids_parts.append(np.asarray([self._separator()], dtype=np.int64))
                start_parts.append(np.ones(1, dtype=bool))
                sentence_parts.append(np.zeros(1, dtype=bool))
            doc += 1
        return self._wrap(np.concatenate(ids_parts), np.concatenate(start_parts), unit, epoch,
                          np.concatenate(sentence_parts) if self.sentence_starts else None)

    def _pair_examples(self, doc: int, epoch: int) -> list[dict[str, Any]]:
        data_epoch = self.objective.data_epoch(epoch)
        rng = random.Random(_seed_of(self.seed, data_epoch, doc, 2))
        sentences = functools.partial(self.source.document_sentences, word_starts=True)
        pairs = create_segment_pairs(sentences(doc), doc, self.source.num_documents, sentences,
                                     self.seq_len - 3, self.pair_mode, rng, self.short_seq_prob)
        examples = []
        cls_, sep = self.special.cls_id, self.special.sep_id
        for index, pair in enumerate(pairs):
            ids = np.concatenate([[cls_], pair.tokens_a, [sep], pair.tokens_b, [sep]])
            starts = np.concatenate([[True], pair.starts_a, [True], pair.starts_b, [True]])
            types = np.zeros(len(ids), dtype=np.int64)
            types[len(pair.tokens_a) + 2:] = 1
            examples.append({"ids": ids.astype(np.int64), "starts": starts.astype(bool),
                             "types": types, "label": pair.label, "epoch": epoch,
                             "example_id": (doc << _PAIR_ID_BITS) | index})
        return examples

    def _block(self, order: np.ndarray, epoch: int, block: int) -> list[dict[str, Any]]:
        """The examples of block ``block`` of an epoch whose units come in ``order``."""
        units = order[block * self.block_units:(block + 1) * self.block_units]
        if self.format == "segment_pairs":
            examples = [e for doc in units.tolist() for e in self._pair_examples(doc, epoch)]
            if self.shuffle:
                random.Random(_seed_of(self.seed, epoch, block, 3)).shuffle(examples)
        else:
            examples = [self._packed_example(unit, epoch) for unit in units.tolist()]
        return examples

    def _unit_examples(self, unit: int, epoch: int) -> list[dict[str, Any]]:
        if self.format == "segment_pairs":
            return self._pair_examples(unit, epoch)
        return [self._packed_example(unit, epoch)]

    def _mixed_raw_batches(self, position: _Position
                           ) -> Iterator[tuple[list[dict[str, Any]], _Position]]:
        """:meth:`_raw_batches` of a source mixture: each example from the source its draw
        names, that source's next example (units in its own epochs' orders)."""
        mixture = self.mixture
        cursors = [list(c) for c in position.cursors or [[0, 0] for _ in mixture.pools]]
        position = replace(position, cursors=cursors)
        current: dict[int, tuple[int, list[dict[str, Any]]]] = {}  # source -> (unit #, examples)
        while True:
            batch: list[dict[str, Any]] = []
            for _ in range(self._batch_size_at(position)):
                source = mixture.source_of(position.drawn)
                cursor = cursors[source]
                for _ in range(len(mixture.pools[source]) + 1):
                    if current.get(source, (None,))[0] != cursor[0]:
                        current[source] = (cursor[0], self._unit_examples(
                            *mixture.unit(source, cursor[0])))
                    if cursor[1] < len(current[source][1]):
                        break
                    cursor[0], cursor[1] = cursor[0] + 1, 0
                else:
                    raise LmlabError(f"source {mixture.names[source]!r} yields no example",
                                     "leave it out of --mix")
                batch.append(current[source][1][cursor[1]])
                cursor[1] += 1
                position.drawn += 1
            position.batches += 1
            position.tokens_seen += sum(len(e["ids"]) for e in batch)
            yield batch, replace(position, cursors=[list(c) for c in cursors])

    def _raw_batches(self, position: _Position) -> Iterator[tuple[list[dict[str, Any]], _Position]]:
        """Lists of examples with the position after each list, from ``position`` on."""
        if self.mixture is not None:
            yield from self._mixed_raw_batches(position)
            return
        position = replace(position)
        order, examples = self._order(position.epoch), None  # examples: of position.block
        while True:
            batch: list[dict[str, Any]] = []
            size = self._batch_size_at(position)
            while len(batch) < size:
                if position.block >= self.num_blocks:
                    if not self.infinite:
                        break
                    position.epoch += 1
                    position.block = position.offset = 0
                    order = self._order(position.epoch)
                if examples is None:
                    examples = self._block(order, position.epoch, position.block)
                take = examples[position.offset:position.offset + size - len(batch)]
                batch.extend(take)
                position.offset += len(take)
                if position.offset >= len(examples):
                    position.block += 1
                    position.offset = 0
                    examples = None
            if not batch:
                return
            position.batches += 1
            position.tokens_seen += sum(len(e["ids"]) for e in batch)
            yield batch, replace(position)
            if len(batch) < size:
                return

    # -- collation ------------------------------------------------------------------------------
    def collate(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Pad examples to ``seq_len`` into a batch of tensors (before corruption)."""
        length, rows = self.seq_len, [example["ids"] for example in examples]
        types = [e["types"] if e["types"] is not None and self.emit_types else () for e in examples]
        arrays = {"input_ids": pad_rows(rows, self.special.pad_id, length),
                  "attention_mask": pad_rows([np.ones(len(row)) for row in rows], 0, length),
                  "token_type_ids": pad_rows(types, 0, length),
                  "word_starts": pad_rows([e["starts"] for e in examples], True, length, bool)}
        if all("sentences" in e for e in examples):
            arrays["sentence_starts"] = pad_rows([e["sentences"] for e in examples], False,
                                                 length, bool)
        batch = {key: torch.from_numpy(array) for key, array in arrays.items()}
        batch["example_id"] = torch.tensor([e["example_id"] for e in examples], dtype=torch.long)
        batch["epoch"] = torch.tensor([e["epoch"] for e in examples], dtype=torch.long)
        if self.format == "segment_pairs":
            batch[PAIR_LABEL_KEYS[self.pair_mode]] = torch.tensor(
                [e["label"] for e in examples], dtype=torch.long)
        return batch

    def _make(self, examples: list[dict[str, Any]], number: int) -> dict[str, torch.Tensor]:
        """Collate and corrupt batch ``number`` (its randomness depends only on the number)."""
        rng = torch.Generator()
        rng.manual_seed(_seed_of(self.seed, number, 5))
        return self.objective.corrupt(self.collate(examples), rng)

    # -- iteration and state ----------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for batch, position in self._made(self._raw_batches(self._position)):
            self._position = position  # the position after the last *yielded* batch
            yield batch

    def _made(self, raw: Iterator[tuple[list[dict[str, Any]], _Position]]
              ) -> Iterator[tuple[dict[str, torch.Tensor], _Position]]:
        """Made batches with their positions, in order; ``workers`` threads make up to
        ``2 * workers`` ahead."""
        if self.workers == 0:
            for examples, position in raw:
                yield self._make(examples, position.batches - 1), position
            return
        with ThreadPoolExecutor(self.workers, thread_name_prefix="lmlab-data") as pool:
            pending: deque = deque()
            try:
                for examples, position in raw:
                    pending.append((pool.submit(self._make, examples, position.batches - 1),
                                    position))
                    if len(pending) > 2 * self.workers:
                        future, done = pending.popleft()
                        yield future.result(), done
                while pending:
                    future, done = pending.popleft()
                    yield future.result(), done
            finally:
                for future, _ in pending:
                    future.cancel()

    @property
    def epoch(self) -> int:
        """Epoch of the next example."""
        return self._position.epoch

    @property
    def tokens_seen(self) -> int:
        """Tokens (special tokens included, padding excluded) in the batches yielded so far."""
        return self._position.tokens_seen

    def state_dict(self) -> dict[str, Any]:
        """The exact position after the last yielded batch (JSON-able)."""
        return {**asdict(self._position), "seed": self.seed, "format": self.format,
                "packing": self.packing, "batch_size": self.batch_size,
                "seq_len": self.seq_len, "num_units": self.num_units,
                "mix": None if self.mixture is None else dict(zip(self.mixture.names,
                                                                  self.mixture.p.tolist())),
                "batch_ramp": None if self.batch_ramp is None else list(self.batch_ramp)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`; the next batches are those the saved stream
        would have yielded (same seed, data, format and sizes required)."""
        own = self.state_dict()
        for key in ("seed", "format", "packing", "seq_len", "num_units", "mix", "batch_ramp"):
            if key in state and state[key] != own[key]:
                raise LmlabError(f"the saved stream state has {key}={state[key]!r}, this stream "
                                 f"{own[key]!r}",
                                 "resume with the same data, seed, format and sequence length")
        self._position = _Position(int(state["epoch"]), int(state["block"]),
                                   int(state["offset"]), int(state["batches"]),
                                   int(state.get("tokens_seen", 0)), int(state.get("drawn", 0)),
                                   state.get("cursors"))

    def __repr__(self) -> str:
        return (f"PretrainingStream({self.split}, format={self.format}, packing={self.packing}, "
                f"units={self.num_units}, batch_size={self.batch_size}, seq_len={self.seq_len})")


def validation_batches(shards_dir: str | os.PathLike | TokenSource, objective: Any,
                       batch_size: int = 32, seq_len: int = 128, seed: int = 1234,
                       max_batches: int | None = None, split: str = "validation",
                       **kwargs: Any) -> list[dict[str, torch.Tensor]]:
    """Batches of the validation split, in order, with corruption fixed by ``seed``: the same
    inputs and targets in every run, so validation losses compare across runs."""
    stream = PretrainingStream(shards_dir, split=split, objective=objective,
                               batch_size=batch_size, seq_len=seq_len, seed=seed, workers=0,
                               shuffle=False, infinite=False, **kwargs)
    return list(itertools.islice(stream, max_batches))
