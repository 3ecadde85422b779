"""Sentence encoding and one bi-encoder training step, side by side: lmlab against
sentence-transformers on all-MiniLM-L6-v2.

Encoding: ``--count`` WordNet example sentences (real lengths), batches of 32, through
``SentenceEncoder.encode`` and ``SentenceTransformer.encode`` (both sort by length first).
Training: forward + backward of the contrastive loss (MultipleNegativesRanking) on the same
batch of ``--pairs`` (example, gloss) pairs, ours with the one padded forward pass over both
columns, theirs through ``MultipleNegativesRankingLoss``. The sides alternate, ``--reps``
times; medians and the ratio ours / theirs (sentences per second, higher is better).

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/bench_sentence_encoders.py --reps 5
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import alternate, environment, print_json  # noqa: E402


def main() -> int:
    from sentence_transformers import SentenceTransformer

    try:
        from sentence_transformers import losses
    except ImportError:
        from sentence_transformers.sentence_transformer import losses

    from lmlab.sentence.data import collate_columns, encode_texts
    from lmlab.sentence.encoder import SentenceEncoder
    from lmlab.sentence.objectives import MultipleNegativesRanking
    from lmlab.text.sources.wordnet import read_synsets
    from lmlab.utils.catalog import minilm_dir
    from lmlab.utils.host import describe_host

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=1024, help="sentences encoded per rep")
    parser.add_argument("--pairs", type=int, default=32, help="pairs in the training batch")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()

    synsets = [s for s in read_synsets() if s.examples]
    sentences = [s.examples[0] for s in synsets[:args.count]]
    anchors = [s.examples[0] for s in synsets[:args.pairs]]
    glosses = [s.definition for s in synsets[:args.pairs]]
    ours = SentenceEncoder.load(minilm_dir())
    theirs = SentenceTransformer(str(minilm_dir()), device="cpu")
    objective = MultipleNegativesRanking(normalize=True)
    their_loss = losses.MultipleNegativesRankingLoss(theirs)
    ids = [encode_texts(ours.tokenizer, c, ours.max_length) for c in (anchors, glosses)]
    batch = collate_columns(ids, [0] * len(anchors), list(range(2 * len(anchors))),
                            ours.tokenizer.pad_token_id)

    def encode_ours() -> float:
        start = time.perf_counter()
        ours.encode(sentences, batch_size=32)
        return len(sentences) / (time.perf_counter() - start)

    def encode_theirs() -> float:
        start = time.perf_counter()
        theirs.encode(sentences, batch_size=32)
        return len(sentences) / (time.perf_counter() - start)

    def step_ours() -> float:
        ours.model.train()
        start = time.perf_counter()
        objective.compute_loss(ours.model, batch).loss.backward()
        ours.model.zero_grad(set_to_none=True)
        return 2 * len(anchors) / (time.perf_counter() - start)

    features = [theirs.tokenize(c) for c in (anchors, glosses)]  # both sides: tokenized before

    def step_theirs() -> float:
        theirs.train()
        start = time.perf_counter()
        their_loss(features, None).backward()
        theirs.zero_grad(set_to_none=True)
        return 2 * len(anchors) / (time.perf_counter() - start)

    encoding = alternate({"lmlab": encode_ours, "sentence-transformers": encode_theirs},
                         args.reps)
    training = alternate({"lmlab": step_ours, "sentence-transformers": step_theirs}, args.reps)
    print_json({
        "host": describe_host(), "environment": environment(), "threads": torch.get_num_threads(),
        "encode_sentences_per_s": {k: round(v["median"], 1) for k, v in encoding.items()},
        "encode_ratio": round(encoding["lmlab"]["median"]
                              / encoding["sentence-transformers"]["median"], 3),
        "mnrl_step_sentences_per_s": {k: round(v["median"], 1) for k, v in training.items()},
        "mnrl_step_ratio": round(training["lmlab"]["median"]
                                 / training["sentence-transformers"]["median"], 3),
        "interference": {"encode": {k: v["interference_s"] for k, v in encoding.items()},
                         "train": {k: v["interference_s"] for k, v in training.items()}},
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
