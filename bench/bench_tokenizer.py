"""Benchmark: lmlab.Tokenizer against direct use of the Rust ``tokenizers`` engine (the wrapper
must not cost: goal ours/engine >= 0.9) and against transformers' pure-Python BERT tokenizer.

Text: sentences of /tmp/lmlab-default-corpus when it exists, else the WordNet + KJV stand-in
corpus of bench_shards.py; slices are used to keep runs short on a shared machine. Sides are
alternated A B A B and medians reported.

    .venv/bin/python bench/bench_tokenizer.py [--reps 3] [--encode-mb 2] [--train-mb 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_shards import DEFAULT_CORPUS, _kjv_documents, _wordnet_documents  # noqa: E402


def sentences(limit_mb: float) -> list[str]:
    """Real sentences, up to ``limit_mb`` MB of UTF-8 text, interleaving the sources."""
    if (DEFAULT_CORPUS / "train.jsonl").exists():
        docs = (json.loads(line) for line in open(DEFAULT_CORPUS / "train.jsonl", encoding="utf-8"))
    else:
        wordnet, kjv = _wordnet_documents(), _kjv_documents()
        docs = [d for pair in zip(wordnet[::10], kjv) for d in pair] + wordnet
    out, size = [], 0
    for doc in docs:
        for sentence in doc["sentences"]:
            out.append(sentence)
            size += len(sentence.encode("utf-8"))
            if size >= limit_mb * 1e6:
                return out
    return out


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def alternate(sides: dict, reps: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(reps):
        for name, fn in sides.items():
            times[name].append(timed(fn)[0])
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--encode-mb", type=float, default=2.0)
    parser.add_argument("--train-mb", type=float, default=4.0)
    parser.add_argument("--python-mb", type=float, default=0.2)
    parser.add_argument("--batch", type=int, default=1000)
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    from tokenizers import Tokenizer as Engine
    from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

    from lmlab.tokenization.tokenizer import Tokenizer
    from lmlab.utils.catalog import minilm_dir

    corpus = "/tmp/lmlab-default-corpus" if (DEFAULT_CORPUS / "train.jsonl").exists() \
        else "WordNet + KJV stand-in"
    print(f"text: {corpus}; reps={args.reps}, A/B alternated, medians")

    # --- training: 30k WordPiece -------------------------------------------------------
    train_texts = sentences(args.train_mb)
    train_mb = sum(len(t.encode()) for t in train_texts) / 1e6

    def ours_train():
        return Tokenizer.train(iter(train_texts), kind="wordpiece", vocab_size=30522)

    def engine_train():
        engine = Engine(models.WordPiece(unk_token="[UNK]"))
        engine.normalizer = normalizers.BertNormalizer(lowercase=True)
        engine.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        engine.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=30522, min_frequency=2, show_progress=False,
                                            special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]",
                                                            "[MASK]"])
        engine.train_from_iterator(
            (train_texts[i:i + 1000] for i in range(0, len(train_texts), 1000)), trainer=trainer)
        return engine

    times = alternate({"lmlab": ours_train, "engine": engine_train}, args.reps)
    a, b = statistics.median(times["lmlab"]), statistics.median(times["engine"])
    print(f"train WordPiece 30k on {train_mb:.1f} MB: lmlab {a:.2f} s, tokenizers {b:.2f} s, "
          f"speed ratio lmlab/engine {b / a:.2f}  reps {times}")

    # --- encoding: MiniLM WordPiece, batches of texts -> ids + masks -------------------------
    tok = Tokenizer.from_pretrained(minilm_dir())
    engine = Engine.from_file(str(minilm_dir() / "tokenizer.json"))
    engine.no_truncation()
    engine.no_padding()
    texts = sentences(args.encode_mb)
    mb = sum(len(t.encode()) for t in texts) / 1e6
    batches = [texts[i:i + args.batch] for i in range(0, len(texts), args.batch)]

    def ours_encode():
        return sum(len(ids) for b in batches for ids in tok(b)["input_ids"])

    def engine_encode():
        total = 0
        for batch in batches:
            encodings = engine.encode_batch(batch)
            ids = [e.ids for e in encodings]
            _ = [e.type_ids for e in encodings], [e.attention_mask for e in encodings]
            total += sum(len(i) for i in ids)
        return total

    tokens = ours_encode()
    assert tokens == engine_encode()
    times = alternate({"lmlab": ours_encode, "engine": engine_encode}, args.reps)
    a, b = statistics.median(times["lmlab"]), statistics.median(times["engine"])
    print(f"encode {mb:.1f} MB ({tokens:,} tokens): lmlab {mb / a:.2f} MB/s {tokens / a / 1e3:.0f}k "
          f"tok/s; tokenizers {mb / b:.2f} MB/s {tokens / b / 1e3:.0f}k tok/s; "
          f"ratio lmlab/engine {b / a:.2f}  reps {times}")

    # --- pure-Python BERT tokenizer (transformers' legacy slow class) ---------------------------
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    slow = BertTokenizerLegacy(str(minilm_dir() / "vocab.txt"), do_lower_case=True)
    small = sentences(args.python_mb)
    small_mb = sum(len(t.encode()) for t in small) / 1e6
    assert [slow(t)["input_ids"] for t in small[:200]] == tok(small[:200])["input_ids"]
    times = alternate({"lmlab": lambda: tok(small), "python": lambda: [slow(t) for t in small]},
                      max(1, args.reps - 1))
    a, b = statistics.median(times["lmlab"]), statistics.median(times["python"])
    print(f"encode {small_mb:.2f} MB: lmlab {small_mb / a:.2f} MB/s; pure-Python BertTokenizer "
          f"{small_mb / b:.3f} MB/s; lmlab is {b / a:.0f}x faster  reps {times}")


if __name__ == "__main__":
    main()
