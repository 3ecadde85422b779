"""Task pipelines: load a model and its tokenizer once, then call on raw text.

``lmlab.pipeline(task, model=path_or_short_name)`` returns a callable object. Tasks and the modules that
implement them are listed in :data:`PIPELINES`; modules are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from lmlab.utils.errors import LmlabError

PIPELINES = {
    "fill-mask": "lmlab.pipelines.fill_mask:FillMaskPipeline",
    "feature-extraction": "lmlab.pipelines.feature_extraction:FeatureExtractionPipeline",
    "text-generation": "lmlab.pipelines.text_generation:TextGenerationPipeline",
    "text-classification": "lmlab.pipelines.classification:TextClassificationPipeline",
    "token-classification": "lmlab.pipelines.classification:TokenClassificationPipeline",
    "question-answering": "lmlab.pipelines.question_answering:QuestionAnsweringPipeline",
}


def pipeline(task: str, model: Any, tokenizer: Any = None, **kwargs: Any):
    """A ready-to-call pipeline for ``task``.

    Args:
        task: one of :data:`PIPELINES`.
        model: a path (Hugging Face folder, lmlab run directory, .gguf), a short name from
            ``lmlab models list`` (``"minilm"``, ``"smollm2"``) or a loaded model. Paths are
            taken literally: a glob such as ``runs/*/run`` is not expanded.
        tokenizer: an lmlab Tokenizer or a path; by default the model folder's own.

    Example:
        >>> embed = lmlab.pipeline("feature-extraction", model="minilm")
        >>> embed(["The vase broke.", "Dawn broke."], pooling="mean").shape
        torch.Size([2, 384])
    """
    if task not in PIPELINES:
        raise LmlabError(f"unknown pipeline task {task!r}", f"use one of {', '.join(PIPELINES)}")
    module_name, class_name = PIPELINES[task].split(":")
    module = importlib.import_module(module_name)
    return getattr(module, class_name).from_model(model, tokenizer=tokenizer, **kwargs)
