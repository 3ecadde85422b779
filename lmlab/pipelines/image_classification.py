"""Image classification (``[{"label", "score"}]``, best first) over a ViT's classification head,
the images prepared by the folder's preprocessor_config.json (docs/vision.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lmlab.models.image_head import IMAGE_CLASSIFICATION
from lmlab.models.images import ImageProcessor
from lmlab.pipelines import HeadPipeline
from lmlab.utils.checks import check_choice

FUNCTIONS = ("default", "softmax", "sigmoid", "none")


class ImageClassificationPipeline(HeadPipeline):
    """Scores as transformers' pipeline: softmax over several labels, sigmoid for one label or
    multi-label models, raw values for regression; the ``top_k`` best (default 5)."""

    head = IMAGE_CLASSIFICATION
    fix = "load a ...ForImageClassification folder"
    takes_images = True  # lmlab.pipeline loads an ImageProcessor instead of a tokenizer

    def __init__(self, model, processor: ImageProcessor | None = None):
        super().__init__(model, processor or ImageProcessor(
            size=dict.fromkeys(("height", "width"), model.config.extra["image_size"])))
        self.processor = self.tokenizer
        extra = model.config.extra
        self.id2label = {i: (extra.get("id2label") or {}).get(i, f"LABEL_{i}")
                         for i in range(int(extra.get("num_labels", 2)))}

    @staticmethod
    def load_processor(source: str | Path, model) -> ImageProcessor:
        return ImageProcessor.from_pretrained(source, model.config.extra["image_size"])

    def _scores(self, logits: torch.Tensor, function: str) -> torch.Tensor:
        problem = self.model.config.extra.get("problem_type")
        if function == "default":
            function = ("none" if problem == "regression" else "sigmoid"
                        if problem == "multi_label_classification" or len(self.id2label) == 1
                        else "softmax")
        if function == "softmax":
            return logits.softmax(-1)
        return logits.sigmoid() if function == "sigmoid" else logits

    @torch.inference_mode()
    def __call__(self, images: Any, top_k: int = 5, function_to_apply: str = "default",
                 batch_size: int = 8) -> list:
        """One image (PIL or array) -> its ranked labels; a list -> a list of those."""
        check_choice(function_to_apply, FUNCTIONS, "function_to_apply", "score function")
        items = images if isinstance(images, list) else [images]
        device = next(self.model.parameters()).device
        results = []
        for start in range(0, len(items), batch_size):
            pixels = self.processor(items[start:start + batch_size]).to(device)
            logits = self.model(pixel_values=pixels, heads=[self.head]).logits.float().cpu()
            for row in self._scores(logits, function_to_apply):
                order = row.argsort(descending=True, stable=True)[:min(top_k, len(row))]
                results.append([{"label": self.id2label[int(i)], "score": float(row[i])}
                                for i in order])
        return results if isinstance(images, list) else results[0]
