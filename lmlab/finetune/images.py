"""Image tasks on the same Trainer as text ones: batches of ``pixel_values`` prepared by the
model's :class:`~lmlab.models.images.ImageProcessor` (a grayscale image becomes the model's
channels and size) instead of tokenized text, and the checks that keep text models off image
tasks and image models off text ones (docs/vision.md).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from lmlab.cost.precision import precision_autocast
from lmlab.finetune.data import ResumableBatches, check_examples
from lmlab.models.image_head import IMAGE_CLASSIFICATION
from lmlab.models.images import ImageProcessor
from lmlab.tasks.types import Example, Task
from lmlab.utils.errors import LmlabError
from lmlab.utils.io import read_json, stable_hash

IMAGE_TASK = IMAGE_CLASSIFICATION  # the task type, named as its head


def folder_config(folder: Path) -> dict[str, Any]:
    """A model folder's config.json values (lmlab's own format keeps ViT's in ``extra``)."""
    file = Path(folder) / "config.json"
    values = read_json(file) if file.is_file() else {}
    return {**(values.get("extra") or {}), **values}


def is_image_folder(folder: Path) -> bool:
    """Whether the folder's model reads images (its config has a ``patch_size``)."""
    return "patch_size" in folder_config(folder)


def image_processor(folder: Path) -> ImageProcessor:
    """The folder's processor: its preprocessor_config.json, else ViT's defaults at the model's
    ``image_size`` and ``num_channels``."""
    values = folder_config(folder)
    return ImageProcessor.from_pretrained(folder, int(values.get("image_size", 224)),
                                          int(values.get("num_channels", 3)))


def check_modality(task: Task, folder: Path) -> None:
    """Refuse an image task on a text model and a text task on an image model."""
    images = is_image_folder(folder)
    if task.type == IMAGE_TASK and not images:
        raise LmlabError(f"task {task.name!r} classifies images; {folder} is a text model",
                         "fine-tune an image model (a ViT folder, or random:FOLDER holding a "
                         "ViT config.json; docs/vision.md)")
    if task.type != IMAGE_TASK and images:
        raise LmlabError(f"{folder} is an image model (ViT); task {task.name!r} is a "
                         f"{task.type} task over text", "give an image task (fashion-mnist, "
                         "digits) or a text model")


def image_batch(task: Task, examples: Sequence[Example], processor: ImageProcessor) -> dict:
    """``pixel_values`` (B, C, H, W), and ``labels`` (B,) when every example has one."""
    batch = {"pixel_values": processor([e.image for e in examples])}
    if all(e.label is not None for e in examples):
        index = task.label_index()
        batch["labels"] = torch.tensor([index[e.label] for e in examples], dtype=torch.long)
    return batch


def images_hash(examples: Sequence[Example]) -> str:
    """A hash of the training images and labels (the run record's ``train_data``)."""
    return stable_hash([(hashlib.sha256(e.image.tobytes()).hexdigest(), e.label)
                        for e in examples])


class ImageStream(ResumableBatches):
    """Endless shuffled epochs of image batches, resumable at (epoch, batch) as a TaskStream;
    images are prepared batch by batch, so a large task never sits in memory as floats."""

    def __init__(self, task: Task, examples: Sequence[Example], processor: ImageProcessor,
                 batch_size: int, seed: int = 0):
        check_examples(task, examples, "train")
        self.task, self.examples, self.processor = task, list(examples), processor
        self.batch_size, self.seed = batch_size, seed

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        order = list(range(len(self.examples)))
        random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]

    def __len__(self) -> int:
        """Batches per epoch."""
        return -(-len(self.examples) // self.batch_size)

    def make_batch(self, indices: list[int]) -> dict[str, Any]:
        return image_batch(self.task, [self.examples[i] for i in indices], self.processor)

    def examples_seen(self) -> int:
        """Training examples the stream has yielded (all epochs, from its position)."""
        done = self.epoch_batches(self.epoch)[:self.position]
        return self.epoch * len(self.examples) + sum(len(batch) for batch in done)


@torch.no_grad()
def predict_images(model, processor: ImageProcessor, task: Task, examples: Sequence[Example],
                   split: str, batch_size: int = 64, precision: str = "fp32") -> list[str]:
    """The predicted label of each example's image."""
    check_examples(task, examples, split)
    model.eval()
    device = next(model.parameters()).device
    labels = []
    for start in range(0, len(examples), batch_size):
        pixels = processor([e.image for e in examples[start:start + batch_size]]).to(device)
        with precision_autocast(precision, device.type):
            logits = model(pixel_values=pixels, heads=[IMAGE_CLASSIFICATION]).logits
        labels += [task.labels[int(i)] for i in logits.float().argmax(-1).cpu()]
    return labels
