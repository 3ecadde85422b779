"""Text classification (``{"label", "score"}``, ``top_k``, text pairs) and token classification
(entities, aggregated per sub-token, per word or into BIO groups; the default follows how the
model was trained) pipelines over fine-tuned task heads. docs/finetuning.md tells the story.
"""

from __future__ import annotations

from typing import Any

import torch

from lmlab.models.inputs import model_inputs
from lmlab.models.task_heads import SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION, task_logits
from lmlab.pipelines import HeadPipeline
from lmlab.utils.checks import check_choice
from lmlab.utils.errors import LmlabError

AGGREGATIONS = ("none", "simple", "first")


def default_aggregation(model) -> str:
    """``"first"`` when the model's words were labelled on their first sub-token, else
    ``"simple"``."""
    from lmlab.finetune.data import WORD_LABELS

    return "first" if model.config.extra.get("word_labels") == WORD_LABELS else "simple"


def _labels(model) -> dict[int, str]:
    names = model.config.extra.get("id2label")
    count = int(model.config.extra.get("num_labels", 2))
    return {i: (names or {}).get(i, f"LABEL_{i}") for i in range(count)}


class TextClassificationPipeline(HeadPipeline):
    """Label and score (softmax; sigmoid-free regression value when ``num_labels == 1``)."""

    head = SEQUENCE_CLASSIFICATION
    fix = "fine-tune one (lmlab finetune) or load a ...ForSequenceClassification folder"

    def __init__(self, model, tokenizer):
        super().__init__(model, tokenizer)
        self.id2label = _labels(model)

    @torch.inference_mode()
    def __call__(self, text: str | dict | list, top_k: int | None = 1,
                 max_length: int = 512) -> Any:
        items = text if isinstance(text, list) else [text]
        firsts = [t["text"] if isinstance(t, dict) else t for t in items]
        pairs = [t.get("text_pair") if isinstance(t, dict) else None for t in items]
        if any(p is not None for p in pairs) and not all(p is not None for p in pairs):
            raise LmlabError("some inputs have a text_pair and others not",
                             "give every input the same form")
        batch = self.tokenizer(firsts, pairs if pairs[0] is not None else None, padding=True,
                               truncation=True, max_length=max_length, return_tensors="pt")
        logits = task_logits(self.model, SEQUENCE_CLASSIFICATION,
                             model_inputs(self.model, batch)).float()
        results = []
        for row in logits:
            if row.numel() == 1:
                results.append({"label": self.id2label[0], "score": float(row[0])})
                continue
            probs = row.softmax(-1)
            order = probs.argsort(descending=True)[: (top_k or len(probs))]
            ranked = [{"label": self.id2label[int(i)], "score": float(probs[i])} for i in order]
            results.append(ranked[0] if top_k == 1 else ranked)
        return results if isinstance(text, list) else results[0]


class TokenClassificationPipeline(HeadPipeline):
    """Per-token tags, aggregated into words and BIO entity groups."""

    head = TOKEN_CLASSIFICATION
    fix = "fine-tune one on a tagging task or load a ...ForTokenClassification folder"

    def __init__(self, model, tokenizer, aggregation_strategy: str | None = None,
                 ignore_labels: tuple[str, ...] = ("O",)):
        super().__init__(model, tokenizer)
        if aggregation_strategy is None:
            aggregation_strategy = default_aggregation(model)
        check_choice(aggregation_strategy, AGGREGATIONS, "aggregation_strategy", "aggregation")
        self.id2label = _labels(model)
        self.aggregation_strategy = aggregation_strategy
        self.ignore_labels = ignore_labels

    @torch.inference_mode()
    def __call__(self, text: str | list[str], max_length: int = 512) -> Any:
        if isinstance(text, list):
            return [self(t, max_length) for t in text]
        batch = self.tokenizer(text, truncation=True, max_length=max_length,
                               return_offsets_mapping=True, return_special_tokens_mask=True,
                               return_tensors="pt")
        logits = task_logits(self.model, TOKEN_CLASSIFICATION, model_inputs(self.model, batch))[0]
        probs = logits.float().softmax(-1)  # (T, num_labels)
        offsets = batch["offset_mapping"][0].tolist()
        special = batch["special_tokens_mask"][0].tolist()
        word_ids = batch.word_ids(0)
        tokens = []
        for i, (start, end) in enumerate(offsets):
            if special[i]:
                continue
            index = int(probs[i].argmax())
            tokens.append({"index": i, "word_id": word_ids[i], "start": start, "end": end,
                           "entity": self.id2label[index], "score": float(probs[i, index]),
                           "word": self.tokenizer.convert_ids_to_tokens(
                               int(batch["input_ids"][0, i]))})
        if self.aggregation_strategy == "none":
            return [{k: t[k] for k in ("entity", "score", "index", "word", "start", "end")}
                    for t in tokens if t["entity"] not in self.ignore_labels]
        return self._group(self._words(tokens), text)

    def _words(self, tokens: list[dict]) -> list[dict]:
        """Merge sub-tokens into words ("first": a word takes its first sub-token's tag;
        "simple": every sub-token stays its own, as transformers' strategy)."""
        if self.aggregation_strategy == "simple":
            return tokens  # each sub-token is its own word; _group copies what it keeps
        words: list[dict] = []
        for token in tokens:
            if words and token["word_id"] is not None and token["word_id"] == words[-1]["word_id"]:
                words[-1]["end"] = token["end"]
                continue
            words.append({"word_id": token["word_id"], "entity": token["entity"],
                          "score": token["score"], "start": token["start"], "end": token["end"]})
        return words

    def _group(self, words: list[dict], text: str) -> list[dict]:
        """Adjacent words with tags ``B-X I-X I-X`` (or ``I-X I-X``) form one entity group;
        a group's score is the mean of its members'."""
        groups: list[dict] = []
        current: dict | None = None
        for word in words:
            tag = word["entity"]
            prefix, _, kind = tag.partition("-") if "-" in tag else ("", "", tag)
            if prefix not in ("B", "I"):
                prefix, kind = "B", tag
            if current is not None and prefix == "I" and kind == current["entity_group"]:
                current["end"] = word["end"]
                current["scores"].append(word["score"])
                continue
            if current is not None:
                groups.append(current)
            current = {"entity_group": kind, "start": word["start"], "end": word["end"],
                       "scores": [word["score"]]}
        if current is not None:
            groups.append(current)
        out = []
        for group in groups:
            if group["entity_group"] in self.ignore_labels:
                continue
            scores = group.pop("scores")
            group["score"] = float(sum(scores) / len(scores))
            group["word"] = text[group["start"]:group["end"]]
            out.append(group)
        return out
