"""lmlab's word2vec against gensim's ``Word2Vec``, and lmlab's GloVe against glove.c's loop.

word2vec: both train on the same in-memory sentences (a fixed slice of an lmlab corpus: every
``--every``-th sentence, words as :func:`lmlab.vectors.sentences.words_of` cuts them) with the
same settings (dim 100, window 5, negative 5, min_count 5, sample 1e-3, 5 epochs, gensim's
learning rates) and the same number of worker threads (gensim's ``workers``, lmlab's
``workers``; each ``--workers`` value in turn), alternating (gensim, lmlab, gensim, lmlab, ...).
Per side: words per second (in-vocabulary words of one pass x epochs over the wall time of the
whole call, vocabulary counting included), median over the repetitions, and the vectors'
scores (WordSim-353 and SimLex-999 Spearman, Google analogies 3CosAdd accuracy, each with its
out-of-vocabulary count), median over the repetitions.

GloVe: lmlab's co-occurrences of the same slice (window 10, min_count 5) are counted once;
then ``--glove-epochs`` epochs of AdaGrad (dim 100, x_max 10) alternate between a one-thread C
rendering of ``glove.c``'s ``glove_thread`` (its layout, ``pow``/``log`` per entry and
gradient clip, over entries shuffled once as its ``shuffle`` tool does; built here with gcc
and glove's own flags, ``-O3 -march=native -funroll-loops``) and lmlab's ``train_glove`` with
each ``--workers`` value (entries reshuffled every epoch), from the same initial tables.
Per side: co-occurrence entries per second per thread (entries x epochs over the training
time, divided by the threads), median, and the scores of ``W + W~``.

    lmlab data build --out corpus/          # the default corpus
    nice -n 10 python bench/bench_word2vec.py --corpus corpus/ --repetitions 3 \\
        --json bench/results/word2vec.json
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import alternate  # noqa: E402

GLOVE_C = r"""
#include <math.h>
#include <stdlib.h>
typedef double real;
typedef struct { int word1, word2; real val; } CREC;  /* cooccur's record, words from 0 here */

/* glove.c's glove_thread over n entries, `epochs` times; W and gradsq hold 2V rows of D + 1
   (the bias last), the context rows after the word rows. Returns the last epoch's cost. */
double glove_loop(const CREC *entries, long long n, real *W, real *gradsq, long long vocab_size,
                  int vector_size, int epochs, real x_max, real alpha, real eta,
                  real grad_clip_value) {
    real *W_updates1 = malloc(vector_size * sizeof(real));
    real *W_updates2 = malloc(vector_size * sizeof(real));
    double cost = 0;
    for (int epoch = 0; epoch < epochs; epoch++) {
        cost = 0;
        for (long long a = 0; a < n; a++) {
            CREC cr = entries[a];
            long long l1 = cr.word1 * (vector_size + 1LL);
            long long l2 = (cr.word2 + vocab_size) * (vector_size + 1LL);
            real diff = 0, fdiff, temp1, temp2;
            for (int b = 0; b < vector_size; b++) diff += W[b + l1] * W[b + l2];
            diff += W[vector_size + l1] + W[vector_size + l2] - log(cr.val);
            fdiff = (cr.val > x_max) ? diff : pow(cr.val / x_max, alpha) * diff;
            if (isnan(diff) || isnan(fdiff) || isinf(diff) || isinf(fdiff)) continue;
            cost += 0.5 * fdiff * diff;
            fdiff *= eta;
            real W_updates1_sum = 0, W_updates2_sum = 0;
            for (int b = 0; b < vector_size; b++) {
                temp1 = fmin(fmax(fdiff * W[b + l2], -grad_clip_value), grad_clip_value);
                temp2 = fmin(fmax(fdiff * W[b + l1], -grad_clip_value), grad_clip_value);
                W_updates1[b] = temp1 / sqrt(gradsq[b + l1]);
                W_updates2[b] = temp2 / sqrt(gradsq[b + l2]);
                W_updates1_sum += W_updates1[b];
                W_updates2_sum += W_updates2[b];
                gradsq[b + l1] += temp1 * temp1;
                gradsq[b + l2] += temp2 * temp2;
            }
            if (!isnan(W_updates1_sum) && !isinf(W_updates1_sum) && !isnan(W_updates2_sum)
                && !isinf(W_updates2_sum)) {
                for (int b = 0; b < vector_size; b++) {
                    W[b + l1] -= W_updates1[b];
                    W[b + l2] -= W_updates2[b];
                }
            }
            W[vector_size + l1] -= fdiff / sqrt(gradsq[vector_size + l1]);
            W[vector_size + l2] -= fdiff / sqrt(gradsq[vector_size + l2]);
            fdiff *= fdiff;
            gradsq[vector_size + l1] += fdiff;
            gradsq[vector_size + l2] += fdiff;
        }
    }
    free(W_updates1);
    free(W_updates2);
    return cost / n;
}
"""


def load_slice(corpus: str, every: int) -> list[list[str]]:
    from lmlab.vectors.sentences import sentences_from

    return [s for n, s in enumerate(sentences_from(corpus)) if n % every == 0]


def scores(vectors) -> dict:
    from lmlab.vectors.evaluate import evaluate_analogies, evaluate_similarity

    out = {}
    for name in ("wordsim353", "simlex999"):
        result = evaluate_similarity(vectors, name)
        out[name] = {"spearman": result.spearman, "oov": result.oov, "pairs": result.pairs}
    result = evaluate_analogies(vectors, "google", "3cosadd")
    out["google_3cosadd"] = {"accuracy": result.accuracy, "oov": result.oov,
                             "scored": result.scored}
    return out


def summarise(speed: dict, evaluations: dict, key: str) -> dict:
    """Per side: the median speed, every run's, the interference, the median scores."""
    result = {}
    for side, runs in evaluations.items():
        result[side] = {
            key: speed[side]["median"], f"{key}_runs": speed[side]["values"],
            "interference": speed[side]["interference_s"],
            **{name: statistics.median(r[name]["spearman"] for r in runs)
               for name in ("wordsim353", "simlex999")},
            "google_3cosadd": statistics.median(r["google_3cosadd"]["accuracy"] for r in runs),
            "oov": {k: runs[0][k]["oov"] for k in runs[0]}, "runs": runs}
    return result


def bench_word2vec(sentences, architecture: str, workers: int, args) -> dict:
    import numpy as np
    from gensim.models import Word2Vec

    from lmlab.vectors.keyed import WordVectors
    from lmlab.vectors.word2vec import Word2VecConfig, train_word2vec

    evaluations: dict[str, list[dict]] = {"gensim": [], "lmlab": []}

    def run_gensim() -> float:
        start = time.perf_counter()
        model = Word2Vec(sentences, vector_size=100, window=5, negative=5, min_count=5,
                         sample=1e-3, epochs=args.epochs, workers=workers,
                         sg=int(architecture == "skipgram"), hs=0, seed=1)
        seconds = time.perf_counter() - start
        evaluations["gensim"].append(scores(WordVectors(model.wv.index_to_key,
                                                        np.asarray(model.wv.vectors))))
        return model.corpus_total_words * args.epochs / seconds

    def run_lmlab() -> float:
        config = Word2VecConfig(architecture=architecture, dim=100, window=5, negative=5,
                                min_count=5, sample=1e-3, epochs=args.epochs, workers=workers)
        start = time.perf_counter()
        vectors, summary = train_word2vec(sentences, config, show_progress=False)
        seconds = time.perf_counter() - start
        evaluations["lmlab"].append(scores(vectors))
        return summary.trained_words / seconds

    speed = alternate({"gensim": run_gensim, "lmlab": run_lmlab}, args.repetitions)
    result = summarise(speed, evaluations, "words_per_second")
    result["speed_ratio"] = (result["lmlab"]["words_per_second"]
                             / result["gensim"]["words_per_second"])
    return result


def build_glove_c(folder: str):
    source, library = Path(folder) / "glove_loop.c", Path(folder) / "glove_loop.so"
    source.write_text(GLOVE_C)
    subprocess.run(["gcc", "-O3", "-march=native", "-funroll-loops", "-shared", "-fPIC",
                    str(source), "-o", str(library), "-lm"], check=True)
    function = ctypes.CDLL(str(library)).glove_loop
    function.restype = ctypes.c_double
    function.argtypes = [ctypes.c_void_p, ctypes.c_longlong, ctypes.c_void_p, ctypes.c_void_p,
                         ctypes.c_longlong, ctypes.c_int, ctypes.c_int, ctypes.c_double,
                         ctypes.c_double, ctypes.c_double, ctypes.c_double]
    return function


def bench_glove(sentences, args, folder: str) -> dict:
    import numpy as np

    from lmlab.vectors.cooccurrence import count_cooccurrences
    from lmlab.vectors.glove import GloveConfig, GloveModel, train_glove
    from lmlab.vectors.keyed import WordVectors
    from lmlab.vectors.sentences import count_words

    vocabulary = count_words(sentences, 5)
    counts = count_cooccurrences(sentences, vocabulary.index(), 10)
    rows, cols, x = counts.entries()
    size, dim, epochs = len(vocabulary.words), 100, args.glove_epochs
    entries = np.empty(len(x), dtype=[("word1", "<i4"), ("word2", "<i4"), ("val", "<f8")])
    order = np.random.default_rng(0).permutation(len(x))  # glove's shuffle: once
    entries["word1"], entries["word2"], entries["val"] = rows[order], cols[order], x[order]
    glove_loop = build_glove_c(folder)
    sides = {"glove.c loop": 1, **{f"lmlab, {w} worker{'s' * (w > 1)}": w for w in args.workers}}
    evaluations: dict[str, list[dict]] = {side: [] for side in sides}

    def run_c() -> float:
        start = GloveModel(size, dim, seed=1)  # lmlab's initial tables, in glove.c's layout
        W = np.concatenate([np.column_stack([start.words, start.word_bias]),
                            np.column_stack([start.contexts, start.context_bias])])
        gradsq = np.ones_like(W)
        began = time.perf_counter()
        glove_loop(entries.ctypes.data, len(x), W.ctypes.data, gradsq.ctypes.data, size, dim,
                   epochs, 10.0, 0.75, 0.05, 100.0)
        seconds = time.perf_counter() - began
        evaluations["glove.c loop"].append(scores(WordVectors(
            vocabulary.words, (W[:size, :dim] + W[size:, :dim]).astype(np.float32))))
        return len(x) * epochs / seconds

    def lmlab_side(side: str, workers: int):
        def run() -> float:
            config = GloveConfig(dim=dim, epochs=epochs, workers=workers)
            vectors, summary = train_glove(sentences, config, show_progress=False,
                                           vocabulary=vocabulary, cooccurrences=counts)
            evaluations[side].append(scores(vectors))
            return len(x) * epochs / summary.train_seconds / workers
        return run

    runs = {side: lmlab_side(side, workers) for side, workers in sides.items()}
    runs["glove.c loop"] = run_c
    speed = alternate(runs, args.repetitions)
    result = summarise(speed, evaluations, "entries_per_second_per_thread")
    result["entries"], result["vocabulary"] = len(x), size
    for side in sides:
        result[side]["ratio"] = (result[side]["entries_per_second_per_thread"]
                                 / result["glove.c loop"]["entries_per_second_per_thread"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True, help="an lmlab corpus folder or text files")
    parser.add_argument("--every", type=int, default=4, help="keep every N-th sentence (4)")
    parser.add_argument("--architectures", default="skipgram,cbow")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--workers", default="1,2", help="worker threads, each in turn (1,2)")
    parser.add_argument("--glove-epochs", type=int, default=5, help="0: no GloVe")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    args.workers = [int(w) for w in args.workers.split(",")]

    from lmlab.utils.host import describe_host
    from lmlab.utils.io import atomic_write_json

    sentences = load_slice(args.corpus, args.every)
    words = sum(map(len, sentences))
    print(f"{len(sentences)} sentences, {words} words", file=sys.stderr)
    host = describe_host(max(args.workers)).rsplit(", torch", 1)[0]  # no torch in these loops
    report = {"host": host, "corpus": args.corpus, "every": args.every,
              "sentences": len(sentences), "words": words, "epochs": args.epochs,
              "glove_epochs": args.glove_epochs, "word2vec": {}, "glove": None}
    for architecture in args.architectures.split(","):
        for workers in args.workers:
            result = bench_word2vec(sentences, architecture, workers, args)
            report["word2vec"][f"{architecture}, {workers} workers"] = result
            print(f"{architecture}, {workers} workers: lmlab / gensim words/s = "
                  f"{result['speed_ratio']:.2f}", file=sys.stderr)
    if args.glove_epochs:
        with tempfile.TemporaryDirectory() as folder:
            report["glove"] = bench_glove(sentences, args, folder)
    print_tables(report)
    if args.json:
        atomic_write_json(args.json, report)


def print_tables(report: dict) -> None:
    print(f"\nhost: {report['host']}; {report['words']:,} words, {report['epochs']} epochs\n")
    print("| word2vec | side | words/s | WordSim-353 | SimLex-999 | analogies 3CosAdd |")
    print("|---|---|---:|---:|---:|---:|")
    for name, result in report["word2vec"].items():
        for side in ("gensim", "lmlab"):
            r = result[side]
            print(f"| {name} | {side} | {r['words_per_second']:,.0f} | {r['wordsim353']:.3f} | "
                  f"{r['simlex999']:.3f} | {100 * r['google_3cosadd']:.1f}% |")
        print(f"| {name} | lmlab / gensim | {result['speed_ratio']:.2f}x | | | |")
    glove = report["glove"]
    if glove:
        print(f"\nGloVe: {glove['entries']:,} co-occurrence entries, {glove['vocabulary']:,} "
              f"words, {report['glove_epochs']} epochs\n")
        print("| GloVe | entries/s per thread | vs glove.c | WordSim-353 | SimLex-999 | "
              "analogies 3CosAdd |")
        print("|---|---:|---:|---:|---:|---:|")
        for side, r in glove.items():
            if isinstance(r, dict):
                print(f"| {side} | {r['entries_per_second_per_thread']:,.0f} | "
                      f"{r['ratio']:.2f}x | {r['wordsim353']:.3f} | {r['simlex999']:.3f} | "
                      f"{100 * r['google_3cosadd']:.1f}% |")
    oov = next(iter(report["word2vec"].values()))["gensim"]["oov"] if report["word2vec"] else {}
    print(f"\nout of vocabulary (gensim's first run): {oov}")


if __name__ == "__main__":
    main()
