"""Aligning English and Spanish word vectors trained apart (Mikolov et al. 2013; Xing et al.
2015; Conneau et al. 2018; Artetxe et al. 2017), on real data that installs offline.

Skip-gram vectors are trained by lmlab on the King James Bible (SWORD module engKJV2006eb) and
on the Reina-Valera 1909 (spaRV1909eb), one space per language and seed. FreeDict's
English-Spanish dictionaries (the pairs both directions agree on) give the word pairs: the
source words are split once into a training and a held-out test part; Mikolov's least-squares
map and orthogonal Procrustes fit the training pairs, Artetxe et al.'s self-learning starts
from the numerals only (English number words and their dictionary translations, since the
Bibles spell numbers out); each is scored by precision@1 and @5 on the test words with
nearest-neighbour and CSLS retrieval; the identity map is the floor.

    python scripts/crosslingual_alignment.py                          # docs/crosslingual.md
    python scripts/crosslingual_alignment.py --books Matt,Mark --epochs 1 --seeds 0 --out /tmp/a

Writes ``OUT/alignment.json`` (every seed's table and the settings), ``OUT/alignment.png`` and
prints the Markdown table (median over seeds, min-max in brackets). Trained spaces are kept
under OUT and reused by a rerun.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import time
from pathlib import Path

from lmlab.text.sources.dictd import freedict_pairs
from lmlab.text.sources.sword import bible_verses
from lmlab.utils.host import describe_host
from lmlab.utils.io import atomic_write_json
from lmlab.vectors.align import METHODS, RETRIEVALS, compare_alignments
from lmlab.vectors.keyed import load_vectors, save_vectors
from lmlab.vectors.sentences import words_of
from lmlab.vectors.word2vec import Word2VecConfig, train_word2vec

MODULES = {"eng": "engKJV2006eb", "spa": "spaRV1909eb"}
NUMERALS = ("one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
            "fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty "
            "seventy eighty ninety hundred thousand").split()
# their Spanish translations: FreeDict also gives "one" as "alguien", "cierto" ...
NUMERALES = ("uno una un dos tres cuatro cinco seis siete ocho nueve diez once doce trece "
             "catorce quince dieciséis diecisiete dieciocho diecinueve veinte treinta cuarenta "
             "cincuenta sesenta setenta ochenta noventa cien ciento mil").split()


@functools.cache
def sentences_of(language: str, books: str) -> list[list[str]]:
    """The words of every verse of one language's Bible (or of ``books``), read once."""
    verses = bible_verses(MODULES[language], books.split(",") if books else None)
    return [words_of(text) for text in verses.values()]


def language_vectors(language: str, seed: int, args: argparse.Namespace, out: Path):
    """The skip-gram space of one language and seed (trained once, then read from OUT)."""
    path = out / f"{language}-seed{seed}.bin"
    if path.exists():
        return load_vectors(str(path))
    sentences = sentences_of(language, args.books)
    config = Word2VecConfig(dim=args.dim, epochs=args.epochs, min_count=args.min_count,
                            seed=seed + 1, workers=args.threads)
    vectors, summary = train_word2vec(sentences, config, show_progress=False)
    print(f"{language} seed {seed}: {summary.vocabulary} words, {summary.corpus_words} corpus "
          f"words, {summary.words_per_second:,.0f} words/s")
    save_vectors(vectors, str(path))
    return vectors


def dictionary_split(vocab_en: set[str], vocab_es: set[str], test_fraction: float
                     ) -> tuple[list, list, list]:
    """(training, test, numeral seed) pairs among words both spaces have: the source words
    split once (seed 0), numerals kept out of the test part."""
    pairs = [(e, s) for e, s in freedict_pairs("eng", "spa") if e in vocab_en and s in vocab_es]
    words = sorted({e for e, _ in pairs if e not in NUMERALS})
    random.Random(0).shuffle(words)
    test_words = set(words[:round(len(words) * test_fraction)])
    seed = [(e, s) for e, s in pairs if e in NUMERALS and s in NUMERALES]
    return ([p for p in pairs if p[0] not in test_words], [p for p in pairs if p[0] in test_words],
            seed)


def summarise(tables: list[dict]) -> dict[str, dict[str, tuple[float, float, float]]]:
    """Median, min and max over seeds of every cell."""
    return {m: {c: (statistics.median(t[m][c] for t in tables), min(t[m][c] for t in tables),
                    max(t[m][c] for t in tables)) for c in tables[0][m]} for m in tables[0]}


def markdown(summary: dict) -> str:
    columns = [f"{r}@{k}" for r in RETRIEVALS for k in (1, 5)]
    lines = ["| map | " + " | ".join(f"{c.replace('nn', 'nearest').replace('csls', 'CSLS')}"
                                      for c in columns) + " |",
             "|---|" + "---:|" * len(columns)]
    for method in METHODS:
        cells = [f"{100 * summary[method][c][0]:.1f}% ({100 * summary[method][c][1]:.1f}-"
                 f"{100 * summary[method][c][2]:.1f})" for c in columns]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(summary: dict, path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 3.6))
    width = 0.2
    for i, cell in enumerate(["nn@1", "csls@1", "nn@5", "csls@5"]):
        medians = [100 * summary[m][cell][0] for m in METHODS]
        errors = [[100 * (summary[m][cell][0] - summary[m][cell][1]) for m in METHODS],
                  [100 * (summary[m][cell][2] - summary[m][cell][0]) for m in METHODS]]
        axes.bar([x + (i - 1.5) * width for x in range(len(METHODS))], medians, width,
                 yerr=errors, capsize=2, label=cell.replace("nn", "nearest").replace(
                     "csls", "CSLS").replace("@", " P@"))
    axes.set_xticks(range(len(METHODS)), METHODS)
    axes.set_ylabel("held-out precision (%)")
    axes.set_title(title, fontsize=9)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def seed_table(seed: int, args: argparse.Namespace, out: Path) -> dict:
    """One seed's alignment table, sizes and minutes, computed once and kept in
    ``OUT/table-seedN.json`` (recomputed when the settings that shape it change), so seeds can
    run in separate processes and a last run over all of them only gathers."""
    settings = {key: getattr(args, key) for key in (
        "books", "dim", "epochs", "min_count", "vocabulary", "test_fraction", "patience")}
    path = out / f"table-seed{seed}.json"
    if path.exists() and (record := json.loads(path.read_text()))["settings"] == settings:
        return record
    started = time.perf_counter()
    english, spanish = (language_vectors(lang, seed, args, out) for lang in ("eng", "spa"))
    train, test, numerals = dictionary_split(set(english.words[:args.vocabulary]),
                                             set(spanish.words[:args.vocabulary]),
                                             args.test_fraction)
    sizes = {"train_pairs": len(train), "test_pairs": len(test),
             "test_words": len({e for e, _ in test}), "seed_pairs": len(numerals),
             "vocabulary": [len(english.words), len(spanish.words)]}
    table = compare_alignments(english, spanish, train, test, numerals, args.vocabulary,
                               random_seed=seed, patience=args.patience)
    record = {"settings": settings, "sizes": sizes, "table": table,
              "minutes": (time.perf_counter() - started) / 60}
    atomic_write_json(path, record)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/crosslingual")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--books", default="", help="OSIS names (default: the whole Bible)")
    parser.add_argument("--dim", type=int, default=100)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--min-count", type=int, default=5)
    parser.add_argument("--vocabulary", type=int, default=20_000)
    parser.add_argument("--test-fraction", type=float, default=0.3)
    parser.add_argument("--patience", type=int, default=50,
                        help="robust self-learning: stalled iterations before keep doubles")
    parser.add_argument("--threads", type=int, default=2,
                        help="word2vec workers (Hogwild threads; 1: the spaces repeat exactly)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    tables, sizes, minutes = [], {}, 0.0
    for seed in seeds:
        record = seed_table(seed, args, out)
        tables.append(record["table"])
        sizes, minutes = record["sizes"], minutes + record["minutes"]
    summary = summarise(tables)
    atomic_write_json(out / "alignment.json", {
        "settings": vars(args), "sizes": sizes, "per_seed": tables, "host": describe_host(),
        "minutes": round(minutes, 1)})
    plot(summary, out / "alignment.png",
         f"English (KJV) -> Spanish (RV 1909) skip-gram, {len(seeds)} seeds, "
         f"{sizes['test_words']} test words")
    print(json.dumps(sizes))
    print(markdown(summary))
    print(f"wrote {out / 'alignment.json'} and {out / 'alignment.png'} ({minutes:.1f} min)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
