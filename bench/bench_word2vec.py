"""lmlab's word2vec against gensim's ``Word2Vec`` on the same corpus and settings.

Both train on the same in-memory sentences (a fixed slice of an lmlab corpus: every
``--every``-th sentence, words as :func:`lmlab.vectors.sentences.words_of` cuts them) with the
same settings (dim 100, window 5, negative 5, min_count 5, sample 1e-3, 5 epochs, gensim's
learning rates) and the same number of threads (gensim's ``workers``, lmlab's torch threads),
alternating (gensim, lmlab, gensim, lmlab, ...). Per side: words per second (in-vocabulary
words of one pass x epochs over the wall time of the whole call, vocabulary counting
included), median over the repetitions, and the vectors' scores (WordSim-353 and SimLex-999
Spearman, Google analogies 3CosAdd accuracy, each with its out-of-vocabulary count), median
over the repetitions.

    lmlab data build --out corpus/          # the default corpus
    nice -n 10 env OMP_NUM_THREADS=1 python bench/bench_word2vec.py --corpus corpus/ \\
        --repetitions 3 --json bench/results/word2vec.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import alternate  # noqa: E402


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True, help="an lmlab corpus folder or text files")
    parser.add_argument("--every", type=int, default=4, help="keep every N-th sentence (4)")
    parser.add_argument("--architectures", default="skipgram,cbow")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    import numpy as np
    import torch
    from gensim.models import Word2Vec

    from lmlab.utils.host import describe_host
    from lmlab.utils.io import atomic_write_json
    from lmlab.vectors.keyed import WordVectors
    from lmlab.vectors.word2vec import Word2VecConfig, train_word2vec

    torch.set_num_threads(args.threads)
    sentences = load_slice(args.corpus, args.every)
    print(f"{len(sentences)} sentences, {sum(map(len, sentences))} words", file=sys.stderr)
    report = {"host": describe_host(args.threads), "corpus": args.corpus, "every": args.every,
              "sentences": len(sentences), "words": sum(map(len, sentences)),
              "epochs": args.epochs, "threads": args.threads, "results": {}}
    for architecture in args.architectures.split(","):
        evaluations: dict[str, list[dict]] = {"gensim": [], "lmlab": []}

        def run_gensim(architecture=architecture, evaluations=evaluations) -> float:
            start = time.perf_counter()
            model = Word2Vec(sentences, vector_size=100, window=5, negative=5, min_count=5,
                             sample=1e-3, epochs=args.epochs, workers=args.threads,
                             sg=int(architecture == "skipgram"), hs=0, seed=1)
            seconds = time.perf_counter() - start
            vectors = WordVectors(model.wv.index_to_key, np.asarray(model.wv.vectors))
            evaluations["gensim"].append(scores(vectors))
            return model.corpus_total_words * args.epochs / seconds

        def run_lmlab(architecture=architecture, evaluations=evaluations) -> float:
            config = Word2VecConfig(architecture=architecture, dim=100, window=5, negative=5,
                                    min_count=5, sample=1e-3, epochs=args.epochs,
                                    threads=args.threads)
            start = time.perf_counter()
            vectors, summary = train_word2vec(sentences, config, show_progress=False)
            seconds = time.perf_counter() - start
            evaluations["lmlab"].append(scores(vectors))
            return summary.trained_words / seconds

        speed = alternate({"gensim": run_gensim, "lmlab": run_lmlab}, args.repetitions)
        result = {}
        for side in ("gensim", "lmlab"):
            runs = evaluations[side]
            result[side] = {
                "words_per_second": speed[side]["median"],
                "words_per_second_runs": speed[side]["values"],
                "interference": speed[side]["interference_s"],
                "wordsim353": statistics.median(r["wordsim353"]["spearman"] for r in runs),
                "simlex999": statistics.median(r["simlex999"]["spearman"] for r in runs),
                "google_3cosadd": statistics.median(r["google_3cosadd"]["accuracy"]
                                                    for r in runs),
                "oov": {k: runs[0][k]["oov"] for k in runs[0]},
                "runs": runs}
        result["speed_ratio"] = (result["lmlab"]["words_per_second"]
                                 / result["gensim"]["words_per_second"])
        report["results"][architecture] = result
        print(f"\n{architecture}: lmlab / gensim words/s = {result['speed_ratio']:.2f}",
              file=sys.stderr)
    print_table(report)
    if args.json:
        atomic_write_json(args.json, report)


def print_table(report: dict) -> None:
    print(f"\nhost: {report['host']}; {report['words']:,} words, {report['epochs']} epochs, "
          f"{report['threads']} thread(s)\n")
    print("| architecture | side | words/s | WordSim-353 | SimLex-999 | analogies 3CosAdd |")
    print("|---|---|---:|---:|---:|---:|")
    for architecture, result in report["results"].items():
        for side in ("gensim", "lmlab"):
            r = result[side]
            print(f"| {architecture} | {side} | {r['words_per_second']:,.0f} | "
                  f"{r['wordsim353']:.3f} | {r['simlex999']:.3f} | "
                  f"{100 * r['google_3cosadd']:.1f}% |")
        print(f"| {architecture} | lmlab / gensim | {result['speed_ratio']:.2f}x | | | |")
    oov = next(iter(report["results"].values()))["gensim"]["oov"]
    print(f"\nout of vocabulary (gensim's run): {oov}")


if __name__ == "__main__":
    main()
