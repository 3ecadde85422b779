"""Task pipelines: load a model and its tokenizer once, then call on raw text.

``lmlab.pipeline(task, model=path_or_short_name)`` loads the model and its tokenizer and returns a
callable object. Tasks and the classes that implement them are listed in :data:`PIPELINES`
(each class names the ``head`` its model is loaded with); modules are imported on first use.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from lmlab.utils.errors import LmlabError
from lmlab.utils.lazy import import_attribute

if TYPE_CHECKING:
    import torch

PIPELINES = {
    "fill-mask": "lmlab.pipelines.fill_mask:FillMaskPipeline",
    "feature-extraction": "lmlab.pipelines.feature_extraction:FeatureExtractionPipeline",
    "text-generation": "lmlab.pipelines.text_generation:TextGenerationPipeline",
    "text2text-generation": "lmlab.pipelines.text_generation:Text2TextGenerationPipeline",
    "text-classification": "lmlab.pipelines.classification:TextClassificationPipeline",
    "token-classification": "lmlab.pipelines.classification:TokenClassificationPipeline",
    "question-answering": "lmlab.pipelines.question_answering:QuestionAnsweringPipeline",
}


def pipeline(task: str, model: Any, tokenizer: Any = None, dtype: torch.dtype | None = None,
             device: str | None = None, **options: Any):
    """A ready-to-call pipeline for ``task``.

    Args:
        task: one of :data:`PIPELINES`.
        model: a path (Hugging Face folder, lmlab run directory, .gguf), a short name from
            ``lmlab models list`` (``"minilm"``, ``"smollm2"``) or a loaded model. Paths are
            taken literally: a glob such as ``runs/*/run`` is not expanded.
        tokenizer: an lmlab Tokenizer or a path; by default the model folder's own.
        dtype, device: where and in which precision the model runs.
        options: the pipeline's own settings (``layer`` and ``batch_size`` for
            feature-extraction, ``aggregation_strategy`` for token-classification).

    Example:
        >>> embed = lmlab.pipeline("feature-extraction", model="minilm")
        >>> embed(["The vase broke.", "Dawn broke."], pooling="mean").shape
        torch.Size([2, 384])
    """
    from lmlab.load import load_model_and_tokenizer

    if task not in PIPELINES:
        raise LmlabError(f"unknown pipeline task {task!r}", f"use one of {', '.join(PIPELINES)}")
    pipeline_class = import_attribute(PIPELINES[task])
    known = [name for name in inspect.signature(pipeline_class).parameters
             if name not in ("model", "tokenizer")]
    unknown = sorted(set(options) - set(known))
    if unknown:  # before the model loads
        raise LmlabError(f"the {task!r} pipeline has no option {', '.join(unknown)}",
                         f"its options: {', '.join(known) or 'none'} (and tokenizer, dtype, "
                         "device)")
    model, tokenizer = load_model_and_tokenizer(model, tokenizer, head=pipeline_class.head,
                                                dtype=dtype, device=device)
    return pipeline_class(model, tokenizer, **options)
