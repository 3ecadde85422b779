"""Task pipelines: ``lmlab.pipeline(task, model=...)`` loads a model and its tokenizer once and
returns an object to call on raw text; :data:`PIPELINES` lists the tasks' classes (each names
the ``head`` its model is loaded with), imported on first use."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmlab.utils.checks import check_choice
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
    "image-classification": "lmlab.pipelines.image_classification:ImageClassificationPipeline",
}


def pipeline(task: str, model: Any, tokenizer: Any = None, dtype: torch.dtype | None = None,
             device: str | None = None, **options: Any):
    """A ready-to-call pipeline for ``task`` (one of :data:`PIPELINES`) on ``model``: a path
    (taken literally, no glob), a short name such as ``"minilm"`` or a loaded model; ``options``
    are the pipeline class's own settings (checked before the model loads).

    Example:
        >>> embed = lmlab.pipeline("feature-extraction", model="minilm")
        >>> embed(["The vase broke.", "Dawn broke."], pooling="mean").shape
        torch.Size([2, 384])
    """
    from lmlab.load import load_model_and_tokenizer

    check_choice(task, PIPELINES, "task", "pipeline task")
    pipeline_class = import_attribute(PIPELINES[task])
    known = [name for name in inspect.signature(pipeline_class).parameters
             if name not in ("model", "tokenizer")]
    unknown = sorted(set(options) - set(known))
    if unknown:  # before the model loads
        raise LmlabError(f"the {task!r} pipeline has no option {', '.join(unknown)}",
                         f"its options: {', '.join(known) or 'none'} (and tokenizer, dtype, "
                         "device)")
    if getattr(pipeline_class, "takes_images", False):  # a preprocessor, no tokenizer
        return _image_pipeline(pipeline_class, model, tokenizer, dtype, device, options)
    model, tokenizer = load_model_and_tokenizer(model, tokenizer, head=pipeline_class.head,
                                                dtype=dtype, device=device)
    return pipeline_class(model, tokenizer, **options)


def _image_pipeline(pipeline_class, model: Any, processor: Any, dtype, device, options):
    """An image pipeline: the model and the preprocessor_config.json of its folder."""
    from lmlab.load import from_pretrained
    from lmlab.utils.catalog import resolve_model_dir

    source = resolve_model_dir(model) if isinstance(model, str | Path) else None
    if source is not None:
        model = from_pretrained(source, head=pipeline_class.head, dtype=dtype)
        if pipeline_class.head in getattr(model, "fresh_heads", []):
            raise LmlabError(f"{source} has no trained {pipeline_class.head!r} head",
                             pipeline_class.fix)
    elif dtype is not None:
        model = model.to(dtype)
    if isinstance(processor, str | Path) or (processor is None and source is not None):
        processor = pipeline_class.load_processor(processor or source, model)
    return pipeline_class((model.to(device) if device else model).eval(), processor, **options)


class HeadPipeline:
    """A pipeline over one head of its model (``head``); a model without it is refused, with
    ``fix`` as the fix."""

    head: str
    fix: str

    def __init__(self, model: Any, tokenizer: Any):
        if self.head not in model.heads:
            raise LmlabError(f"this model has no {self.head!r} head", self.fix)
        self.model, self.tokenizer = model, tokenizer
