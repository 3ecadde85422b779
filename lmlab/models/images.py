"""What an image model takes: ``pixel_values`` from PIL images or arrays, prepared as a
checkpoint's ``preprocessor_config.json`` says (transformers' ViTImageProcessor: PIL resize,
rescale, normalise), and that file written for a model lmlab saves."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmlab.utils.errors import LmlabError
from lmlab.utils.io import atomic_write_json, read_json, stable_hash

PREPROCESSOR_FILE = "preprocessor_config.json"
BILINEAR = 2  # PIL.Image.Resampling.BILINEAR, ViT's resample


@dataclass
class ImageProcessor:
    """Resize (to ``size``'s height x width, PIL ``resample``), rescale (x ``rescale_factor``)
    and normalise ((x - mean) / std per channel); each step switched by its ``do_`` flag."""

    size: dict[str, int] = field(default_factory=lambda: {"height": 224, "width": 224})
    do_resize: bool = True
    resample: int = BILINEAR
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: list[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    image_std: list[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])

    @classmethod
    def from_pretrained(cls, path: str | Path, image_size: int | None = None,
                        num_channels: int = 3) -> ImageProcessor:
        """The folder's preprocessor_config.json; without one, ViT's defaults at ``image_size``
        (mean and std 0.5 on each of ``num_channels``)."""
        file = Path(path) / PREPROCESSOR_FILE
        if not file.exists():
            side = image_size or 224
            return cls(size={"height": side, "width": side}, image_mean=[0.5] * num_channels,
                       image_std=[0.5] * num_channels)
        values = read_json(file)
        size = values.get("size", {"height": 224, "width": 224})
        if isinstance(size, int):
            size = {"height": size, "width": size}
        if set(size) != {"height", "width"}:
            raise LmlabError(f"{file}: size {size} (lmlab resizes to a height and width)",
                             'give size as {"height": ..., "width": ...}')
        if values.get("do_center_crop"):
            raise LmlabError(f"{file} asks for a centre crop, which lmlab does not do",
                             "use a ViT processor configuration (resize, rescale, normalise)")
        known = {name for name in cls.__dataclass_fields__ if name in values and name != "size"}
        return cls(size=dict(size), **{name: values[name] for name in known})

    def save_pretrained(self, path: str | Path) -> Path:
        """Write preprocessor_config.json (transformers reads it as a ViTImageProcessor)."""
        Path(path).mkdir(parents=True, exist_ok=True)
        atomic_write_json(Path(path) / PREPROCESSOR_FILE,
                          {**asdict(self), "image_processor_type": "ViTImageProcessor"})
        return Path(path)

    def fingerprint(self) -> str:
        """A hash of the settings (a run records what prepared its images)."""
        return stable_hash(asdict(self))

    def __call__(self, images: Any) -> torch.Tensor:
        """``pixel_values`` (B, C, height, width) float32 of one image or a list: PIL images
        (made RGB) or arrays (H, W, C) / (C, H, W) of uint8 or floats in [0, 1]."""
        items = images if isinstance(images, list | tuple) else [images]
        return torch.from_numpy(np.stack([self._one(image) for image in items]))

    def _one(self, image: Any) -> np.ndarray:
        array = _channels_first(image)  # (C, H, W)
        if array.shape[0] == 1 and len(self.image_mean) == 3:  # grayscale as RGB, as PIL's
            array = np.repeat(array, 3, axis=0)  # convert("RGB") does: (3, H, W)
        if self.do_resize:
            array = _pil_resize(array, (self.size["height"], self.size["width"]), self.resample)
        if self.do_rescale:
            array = (array.astype(np.float64) * self.rescale_factor).astype(np.float32)
        if self.do_normalize:
            array = array.astype(np.float32) if not np.issubdtype(array.dtype, np.floating) \
                else array
            if len(self.image_mean) != array.shape[0]:
                raise LmlabError(f"an image of {array.shape[0]} channels; the processor "
                                 f"normalises {len(self.image_mean)}",
                                 "pass RGB images (PIL: image.convert('RGB'))")
            mean = np.array(self.image_mean, dtype=array.dtype)
            std = np.array(self.image_std, dtype=array.dtype)
            array = ((array.T - mean) / std).T
        return array.astype(np.float32)


def _channels_first(image: Any) -> np.ndarray:
    """An image as a (C, H, W) array: PIL converted to RGB as transformers' pipeline does."""
    if hasattr(image, "convert"):  # a PIL image
        return np.moveaxis(np.array(image.convert("RGB")), -1, 0)
    array = image.numpy() if isinstance(image, torch.Tensor) else np.asarray(image)
    if array.ndim == 2:
        return array[None]
    if array.ndim != 3:
        raise LmlabError(f"an image array of shape {array.shape}",
                         "pass (height, width, channels), (channels, height, width) or 2-D")
    return array if array.shape[0] in (1, 3, 4) else np.moveaxis(array, -1, 0)


def _pil_resize(array: np.ndarray, size: tuple[int, int], resample: int) -> np.ndarray:
    """Resize through PIL as transformers does: floats in [0, 1] go to uint8 and back."""
    from PIL import Image

    scaled = not np.issubdtype(array.dtype, np.integer) and not np.allclose(array, array.round())
    if scaled and (array.min() < 0 or array.max() > 1):
        raise LmlabError(f"pixel values in [{array.min()}, {array.max()}]",
                         "pass uint8 images (0-255) or floats in [0, 1]")
    last = np.moveaxis(array, 0, -1)  # (H, W, C)
    last = last[..., 0] if last.shape[-1] == 1 else last
    pixels = (last.astype(np.float64) * 255).astype(np.float32) if scaled else last
    resized = np.array(Image.fromarray(pixels.astype(np.uint8)).resize(size[::-1], resample))
    resized = resized[None] if resized.ndim == 2 else np.moveaxis(resized, -1, 0)
    return (resized.astype(np.float64) * (1 / 255)).astype(np.float32) if scaled else resized
