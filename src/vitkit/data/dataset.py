"""`ImageDataset`: decoded images held in memory as one tensor, with their targets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from vitkit.errors import DataError


@dataclass
class ImageDataset:
    """`images` uint8 (N, C, H, W) pictures, or float32 ones (scientific arrays, in their own
    units); `labels` the targets: int64 class indices (N,), or float32 (N, K) for regression
    and multi-label tasks (`vitkit.tasks`); `classes[i]` names class, target or label i.

    `skipped` counts files that could not be read when the dataset was built;
    `skipped_files` names every one as (path, "kind: detail"), e.g.
    ("pets/train/cat/3.jpg", "truncated: image file is truncated").
    """

    images: torch.Tensor
    labels: torch.Tensor
    classes: list[str]
    name: str = ""
    skipped: int = 0
    notes: list[str] = field(default_factory=list)
    skipped_files: list[tuple[str, str]] = field(default_factory=list)
    streamed: ClassVar[bool] = False  # held in memory at one size (see `sources.records`)

    def __post_init__(self) -> None:
        if self.images.dim() != 4 or self.images.dtype not in (torch.uint8, torch.float32):
            raise DataError(f"images must be uint8 or float32 (N, C, H, W), got "
                            f"{self.images.dtype} {tuple(self.images.shape)}")
        if len(self.images) != len(self.labels):
            raise DataError(f"{len(self.images)} images but {len(self.labels)} labels")
        if self.labels.is_floating_point():
            self.labels = self.labels.float().reshape(len(self.labels), -1)
        else:
            self.labels = self.labels.long()

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def image_size(self) -> tuple[int, int]:
        return (self.images.shape[2], self.images.shape[3])

    @property
    def channels(self) -> int:
        return self.images.shape[1]

    def subset(self, indices: torch.Tensor | slice) -> ImageDataset:
        """The images at `indices` (a slice or an index tensor), same classes."""
        return ImageDataset(self.images[indices], self.labels[indices], self.classes,
                            self.name, self.skipped, list(self.notes), list(self.skipped_files))
