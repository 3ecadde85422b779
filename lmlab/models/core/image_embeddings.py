"""ViT's input (Dosovitskiy et al. 2021): an image cut into patches, each projected to the hidden
width, a learned [CLS] vector in front and a learned position per patch and [CLS]; what the core
stack embeds instead of tokens when ``config.extra`` has a ``patch_size``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional as F

from lmlab.utils.errors import LmlabError

if TYPE_CHECKING:  # config.py reads the geometry here: no import cycle
    from lmlab.models.config import TransformerConfig


def takes_images(config: TransformerConfig) -> bool:
    """Whether ``config`` describes a stack over image patches (``pixel_values``), not tokens."""
    return config.extra.get("patch_size") is not None


def pair(value: int | list[int] | tuple[int, int]) -> tuple[int, int]:
    """(height, width) of a size given as one number or two, as ViT's config.json allows."""
    return (int(value), int(value)) if isinstance(value, int) else (int(value[0]), int(value[1]))


def patch_grid(config: TransformerConfig) -> tuple[int, int]:
    """Patches per column and per row of the image size the model was built for."""
    (height, width), (ph, pw) = pair(config.extra["image_size"]), pair(config.extra["patch_size"])
    return height // ph, width // pw


class ImageEmbeddings(nn.Module):
    """``(B, C, H, W)`` pixels -> ``(B, 1 + patches, hidden)``: a convolution with stride =
    kernel = patch size (a linear map of each flattened patch), [CLS] prepended, positions
    added; ``interpolate_pos_encoding`` resizes the position grid (bicubic) to another image
    size, as transformers' ViT does."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.image_size, self.patch_size = pair(config.extra["image_size"]), \
            pair(config.extra["patch_size"])
        self.num_channels = int(config.extra.get("num_channels", 3))
        rows, columns = patch_grid(config)
        hidden = config.hidden_size
        self.patch_projection = nn.Conv2d(self.num_channels, hidden, kernel_size=self.patch_size,
                                          stride=self.patch_size)
        self.cls_token = nn.Parameter(torch.empty(1, 1, hidden))
        self.position_embeddings = nn.Parameter(torch.empty(1, 1 + rows * columns, hidden))
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.reset_parameters(config.initializer_range)

    def reset_parameters(self, std: float) -> None:
        """transformers' initialisation: truncated normal [CLS] and positions, normal kernel."""
        nn.init.trunc_normal_(self.cls_token, std=std)
        nn.init.trunc_normal_(self.position_embeddings, std=std)
        nn.init.normal_(self.patch_projection.weight, std=std)
        nn.init.zeros_(self.patch_projection.bias)

    def positions(self, patches: int, height: int, width: int) -> torch.Tensor:
        """The (1, 1 + patches, hidden) positions for an image of ``height`` x ``width``:
        the table itself when its grid fits a square image, else its patch grid resized."""
        table = self.position_embeddings
        stored = table.shape[1] - 1
        if patches == stored and height == width:
            return table
        side = int(stored ** 0.5)  # transformers assumes a square stored grid
        grid = table[:, 1:].reshape(1, side, side, -1).permute(0, 3, 1, 2)  # (1, hidden, s, s)
        grid = F.interpolate(grid, size=(height // self.patch_size[0], width // self.patch_size[1]),
                             mode="bicubic", align_corners=False)
        grid = grid.permute(0, 2, 3, 1).reshape(1, -1, table.shape[-1])  # (1, patches, hidden)
        return torch.cat([table[:, :1], grid], dim=1)

    def forward(self, pixel_values: torch.Tensor,
                interpolate_pos_encoding: bool = False) -> torch.Tensor:
        """Embed; returns (B, 1 + patches, hidden)."""
        if pixel_values.dim() != 4 or pixel_values.shape[1] != self.num_channels:
            raise LmlabError(f"pixel_values of shape {tuple(pixel_values.shape)}: this model "
                             f"takes (batch, {self.num_channels}, height, width)",
                             "prepare images with lmlab.models.images.ImageProcessor")
        height, width = pixel_values.shape[2:]
        if not interpolate_pos_encoding and (height, width) != self.image_size:
            raise LmlabError(f"images of {height}x{width} pixels; the positions were learned "
                             f"for {self.image_size[0]}x{self.image_size[1]}",
                             "resize the images, or pass interpolate_pos_encoding=True")
        weight = self.patch_projection.weight
        x = self.patch_projection(pixel_values.to(weight.dtype))  # (B, hidden, rows, columns)
        x = x.flatten(2).transpose(1, 2)  # (B, patches, hidden)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return self.dropout(x + self.positions(x.shape[1] - 1, height, width))
