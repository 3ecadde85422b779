"""Text generation: continue prompts (or chat) with a causal LM.

Example:
    >>> generate = lmlab.pipeline("text-generation", model="smollm2")
    >>> generate("Once upon a time", max_new_tokens=30, do_sample=True, top_p=0.9, seed=0)
    [{'generated_text': 'Once upon a time, ...'}]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from lmlab.utils.errors import LmlabError


class TextGenerationPipeline:
    """``pipe(prompt or prompts, **generation options)`` -> ``[{"generated_text": ...}]`` per
    prompt (prompt and continuation, unless ``return_full_text=False``)."""

    head = None  # the saved heads: head="clm" would reject a tied LM head (in fresh_heads)

    def __init__(self, model: Any, tokenizer: Any):
        if not getattr(model.config, "causal", False) or "clm" not in model.heads:
            raise LmlabError("text generation needs a causal LM with a 'clm' head",
                             "load a GPT-2/Llama checkpoint or a .gguf file")
        self.model, self.tokenizer = model, tokenizer

    def __call__(self, prompts: str | Sequence[str], return_full_text: bool = True,
                 seed: int | None = None, on_text: Callable[[str], None] | None = None,
                 **options: Any) -> list[dict[str, str]] | list[list[dict[str, str]]]:
        from lmlab.generation.generate import generate_text

        single = isinstance(prompts, str)
        texts = [prompts] if single else list(prompts)
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        outputs = generate_text(self.model, self.tokenizer, texts, generator=generator,
                                on_text=on_text, **options)
        results = [[{"generated_text": (p + o) if return_full_text else o}]
                   for p, o in zip(texts, outputs)]
        return results[0] if single else results


class Text2TextGenerationPipeline(TextGenerationPipeline):
    """An encoder-decoder's output for each input text (``[{"generated_text": ...}]``), greedy
    by default; generation options as for :func:`lmlab.generate`.

    Example:
        >>> solve = lmlab.pipeline("text2text-generation", model="runs/integration/model")
        >>> solve("mul INT+ 2 x", num_beams=5)
        [{'generated_text': 'pow x INT+ 2'}]
    """

    head = "seq2seq-lm"

    def __init__(self, model: Any, tokenizer: Any):
        if not getattr(model.config, "is_encoder_decoder", False):
            raise LmlabError("text2text generation needs an encoder-decoder (T5, BART, Marian)",
                             "use the text-generation pipeline for a decoder like GPT-2")
        self.model, self.tokenizer = model, tokenizer

    def __call__(self, texts: str | Sequence[str], seed: int | None = None,
                 **options: Any) -> list[dict[str, str]] | list[list[dict[str, str]]]:
        return super().__call__(texts, return_full_text=False, seed=seed, **options)
