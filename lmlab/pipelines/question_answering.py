"""Extractive question answering: ``qa(question=..., context=...)`` -> ``{"answer", "start",
"end", "score"}``: the best span of at most ``max_answer_len`` tokens over overlapping windows,
scored as transformers does (start times end probability within its window).
"""

from __future__ import annotations

from typing import Any

import torch

from lmlab.models.inputs import model_inputs
from lmlab.models.task_heads import QUESTION_ANSWERING, task_logits
from lmlab.pipelines import HeadPipeline
from lmlab.utils.errors import LmlabError


class QuestionAnsweringPipeline(HeadPipeline):
    """Answer span of a question in a context."""

    head = QUESTION_ANSWERING
    fix = "fine-tune one on a SQuAD-style task or load a ...ForQuestionAnswering folder"

    @torch.inference_mode()
    def __call__(self, question: str | None = None, context: str | None = None,
                 top_k: int = 1, max_answer_len: int = 15, max_seq_len: int = 384,
                 doc_stride: int = 128, handle_impossible_answer: bool = False) -> Any:
        if not question or not context:
            raise LmlabError("question answering needs a question and a context",
                             "call qa(question='...', context='...')")
        encoded = self.tokenizer(question, context, truncation="only_second",
                                 max_length=max_seq_len, stride=doc_stride,
                                 return_overflowing_tokens=True, return_offsets_mapping=True,
                                 padding=True, return_tensors="pt")
        inputs = model_inputs(self.model, encoded)  # offsets and overflow mapping stay behind
        logits = task_logits(self.model, QUESTION_ANSWERING, inputs).float()  # (W, T, 2)
        candidates = []
        null_score = 0.0
        for window in range(logits.shape[0]):
            sequence_ids = encoded.sequence_ids(window)
            mask = torch.tensor([s != 1 for s in sequence_ids])
            mask[0] = False  # keep [CLS] for the null answer
            pad = encoded["attention_mask"][window] == 0
            start = logits[window, :, 0].masked_fill(mask | pad, float("-inf")).softmax(-1)
            end = logits[window, :, 1].masked_fill(mask | pad, float("-inf")).softmax(-1)
            null_score = max(null_score, float(start[0] * end[0]))
            scores = torch.triu(start[:, None] * end[None, :])  # (T, T): start <= end
            scores = torch.tril(scores, max_answer_len - 1)
            scores[0, :] = 0
            scores[:, 0] = 0
            flat = scores.flatten()
            k = min(top_k, int((flat > 0).sum()))
            if k == 0:
                continue
            best = flat.topk(k)
            offsets = encoded["offset_mapping"][window].tolist()
            for score, index in zip(best.values.tolist(), best.indices.tolist()):
                s, e = divmod(index, scores.shape[1])
                a, b = offsets[s][0], offsets[e][1]
                candidates.append({"score": score, "start": a, "end": b, "answer": context[a:b]})
        if handle_impossible_answer:
            candidates.append({"score": null_score, "start": 0, "end": 0, "answer": ""})
        candidates.sort(key=lambda c: -c["score"])
        if not candidates:
            return {"score": 0.0, "start": 0, "end": 0, "answer": ""}
        return candidates[0] if top_k == 1 else candidates[:top_k]
