"""The demo's look inside the pretrained model: the seeds' context-dependent words, and
fill-mask guesses."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch


def collect_occurrences(corpus_dir: Path, words: list[str], limit: int) -> dict[str, list[str]]:
    """Up to ``limit`` corpus sentences per word, in one pass over the corpus."""
    from lmlab.analysis.neighbours import corpus_sentences

    patterns = {w: re.compile(rf"(?<![\w'-]){re.escape(w)}(?![\w'-])", re.IGNORECASE)
                for w in words}
    found: dict[str, list[str]] = {w: [] for w in words}
    for sentence in corpus_sentences(corpus_dir):
        if len(sentence) > 300:
            continue
        for word, pattern in patterns.items():
            if len(found[word]) < limit and pattern.search(sentence):
                found[word].append(sentence)
        if all(len(v) >= limit for v in found.values()):
            break
    return found


def contextual_examples(model_dir: Path, corpus_dir: Path, examples: dict[str, list[str]],
                        limit: int, k: int = 3) -> list[dict[str, Any]]:
    """For each word and query sentence: nearest corpus occurrences under the last layer
    (contextual) and under layer 0 (the embedding layer: no context), and how similar the
    word's vectors in the two query sentences are at each layer."""
    from lmlab.analysis.neighbours import ContextualIndex, StaticWordVectors
    from lmlab.load import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(model_dir)
    occurrences = collect_occurrences(corpus_dir, list(examples), limit)
    static = StaticWordVectors(model, tokenizer)
    rows = []
    for word, queries in examples.items():
        if not occurrences[word]:
            rows.append({"word": word, "error": "the corpus has no sentence with this word"})
            continue
        entry: dict[str, Any] = {"word": word, "occurrences": len(occurrences[word]),
                                 "static_vocabulary_neighbours": static.nearest_words(word, 6),
                                 "queries": []}
        similarity = {}
        for layer_name, layer in (("contextual", "last"), ("layer0", 0)):
            index = ContextualIndex.build(model, tokenizer, occurrences[word], word, layer=layer)
            vectors = []
            for query in queries:
                encoded = index.extractor.encode([query])[0]
                words, vecs = encoded.word_vectors("mean")
                position = [w.lower() for w in words].index(word)
                vectors.append(vecs[position])
            similarity[layer_name] = float(torch.nn.functional.cosine_similarity(
                vectors[0], vectors[1], dim=0)) if len(vectors) > 1 else None
            for number, query in enumerate(queries):
                if len(entry["queries"]) <= number:
                    entry["queries"].append({"query": query})
                entry["queries"][number][layer_name] = [
                    {"score": round(h.score, 3), "sentence": h.sentence}
                    for h in index.query(query, k=k)]
        entry["query_similarity"] = similarity
        rows.append(entry)
    return rows


def fill_mask_examples(model_dir: Path, sentences: list[str], top_k: int = 5) -> list[dict]:
    from lmlab.pipelines import pipeline

    fill = pipeline("fill-mask", model=model_dir)
    rows = []
    for sentence in sentences:
        guesses = fill(sentence, top_k=top_k)
        rows.append({"text": sentence, "guesses": [
            {"token": g["token_str"], "score": round(g["score"], 4)} for g in guesses]})
    return rows


def unigram_counts(shards: str | Path, split: str = "train") -> Any:
    """Occurrences of each token id in a split of a shard folder, special tokens left out
    (masked LM never predicts them): an int64 array of the vocabulary's length."""
    import numpy as np

    from lmlab.data.shard_reader import ShardReader

    reader = ShardReader(shards, split)
    counts = np.zeros(0, dtype=np.int64)
    for index in range(len(reader.info["shards"])):
        shard = np.bincount(reader._shard(index, words=False)).astype(np.int64)
        if shard.size < counts.size:
            shard, counts = counts, shard
        shard[:counts.size] += counts
        counts = shard
    counts[[i for i in reader.special_ids.values() if i < counts.size]] = 0
    return counts


def unigram_baseline(counts: Any) -> dict[str, float]:
    """What masked LM scores without using context: ``entropy`` (nats) of the unigram
    distribution ``p = counts / sum`` (the loss of always predicting ``p``) and
    ``majority_accuracy``, the share of the most frequent token (always guessing it)."""
    import numpy as np

    counts = np.asarray(counts, dtype=np.float64)
    total = counts.sum()
    if total <= 0:
        raise ValueError("unigram_baseline needs at least one counted token")
    p = counts[counts > 0] / total
    return {"entropy": float(-(p * np.log(p)).sum()),
            "majority_accuracy": float(counts.max() / total), "tokens": int(total)}


def masked_lm_score(model_dir: Path, shards: Path, mask_prob: float = 0.15,
                    batch_size: int = 32, seq_len: int = 128, batches: int = 8,
                    replacement: tuple[float, float, float] | None = None
                    ) -> dict[str, float]:
    """Validation MLM loss and accuracy of a saved model at masking rate ``mask_prob`` on the
    fixed validation batches (seed 1234, as pretraining evaluates): a figure that compares
    across runs pretrained with different masking rates. Means over every masked position (each
    batch weighted by its predictions), as the Trainer evaluates. ``replacement`` is the
    chosen tokens' (mask, random, keep) split (default: the objective's, BERT's 80/10/10);
    ``(1, 0, 0)`` scores prediction from context alone, which compares models pretrained with
    different splits."""
    from lmlab.data.pretraining import validation_batches
    from lmlab.load import from_pretrained
    from lmlab.objectives.registry import build_objective
    from lmlab.objectives.special_tokens import SpecialTokens
    from lmlab.tokenization.tokenizer import Tokenizer

    model = from_pretrained(model_dir, head="mlm").eval()
    objective = build_objective("mlm", SpecialTokens.from_tokenizer(
        Tokenizer.from_pretrained(model_dir)), mask_prob=mask_prob,
        **({} if replacement is None else {"replacement": replacement}))
    objective.eval()
    loss = accuracy = predictions = 0.0
    data = validation_batches(shards, objective, batch_size=batch_size, seq_len=seq_len,
                              seed=1234, max_batches=batches)
    with torch.no_grad():
        for batch in data:
            result = objective.compute_loss(model, batch)
            weight = float(result.num_predictions)
            loss += weight * float(result.loss)
            accuracy += weight * float(result.metrics["mlm_accuracy"])
            predictions += weight
    return {"mask_prob": mask_prob, "loss": loss / predictions,
            "accuracy": accuracy / predictions}
