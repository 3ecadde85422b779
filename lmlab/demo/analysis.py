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
    from lmlab.pipelines.base import load_model_and_tokenizer

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
