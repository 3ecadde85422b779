"""Fill-mask: the masked-LM head's top-k guesses for each [MASK] in a text."""

from __future__ import annotations

import torch

from lmlab.models.inputs import model_inputs
from lmlab.pipelines import HeadPipeline
from lmlab.utils.errors import LmlabError


class FillMaskPipeline(HeadPipeline):
    """``fill("Paris is the [MASK] of France.", top_k=5)`` -> ``[{"score", "token", "token_str",
    "sequence"}]``, one list per mask (each predicted with the others left masked)."""

    head = "mlm"
    fix = "load it with head='mlm' from a checkpoint that has one"

    def __init__(self, model, tokenizer):
        super().__init__(model, tokenizer)
        if tokenizer.mask_token_id is None:
            raise LmlabError("the tokenizer has no mask token", "use a BERT-style tokenizer")

    @torch.inference_mode()
    def __call__(self, text: str | list[str], top_k: int = 5):
        if isinstance(text, list):
            return [self(t, top_k=top_k) for t in text]
        batch = self.tokenizer(text, return_tensors="pt", truncation=True)
        ids = batch["input_ids"]
        positions = (ids[0] == self.tokenizer.mask_token_id).nonzero().squeeze(-1).tolist()
        if not positions:
            raise LmlabError(f"no {self.tokenizer.mask_token} token in {text!r}",
                             f"write {self.tokenizer.mask_token} where a word should be guessed")
        out = self.model(**model_inputs(self.model, batch), heads=["mlm"])
        probs = out.logits[0].float().softmax(-1)
        special = torch.tensor(self.tokenizer.all_special_ids)
        results = []
        for position in positions:
            p = probs[position].clone()
            p[special] = 0.0
            top = p.topk(top_k)
            guesses = []
            for score, token_id in zip(top.values.tolist(), top.indices.tolist()):
                filled = ids[0].clone()
                filled[position] = token_id
                guesses.append({
                    "score": score, "token": token_id,
                    "token_str": self.tokenizer.decode([token_id]).strip(),
                    "sequence": self.tokenizer.decode(filled, skip_special_tokens=True),
                })
            results.append(guesses)
        return results[0] if len(results) == 1 else results
