"""`ImageDataset`: decoded images held in memory as one tensor, with their targets."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch

from vitkit.errors import DataError


@dataclass
class ImageDataset:
    """`images` uint8 (N, C, H, W) pictures, or float32 ones (scientific arrays, in their own
    units); `labels` the targets: int64 class indices (N,), or float32 (N, K) for regression
    and multi-label tasks (`vitkit.tasks`); `classes[i]` names class, target or label i.

    `stored_dtype`: the numpy dtype arrays were stored in ("" for pictures), so weights of
    8-bit pictures can refuse float arrays, whose values are not 0-255.
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
    stored_dtype: str = ""
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

    @property
    def float_images(self) -> bool:
        """True for float arrays in their own units (data=arrays), False for 8-bit pictures."""
        return self.images.is_floating_point()

    def channel_stats(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Per-channel (mean, std) of the images in the units `normalize` divides them into
        (uint8 pictures / 255, float arrays as held); see `channel_stats_of`."""
        scale = 255.0 if self.images.dtype == torch.uint8 else 1.0
        per_image = self.images[0].numel() if len(self.images) else 1
        rows = max(1, STATS_CHUNK_BYTES // (8 * per_image))
        return channel_stats_of(self.images[start:start + rows].numpy() / scale
                                for start in range(0, len(self.images), rows))

    def subset(self, indices: torch.Tensor | slice) -> ImageDataset:
        """The images at `indices` (a slice or an index tensor), same classes."""
        return ImageDataset(self.images[indices], self.labels[indices], self.classes,
                            self.name, self.skipped, list(self.notes), list(self.skipped_files),
                            self.stored_dtype)


STATS_CHUNK_BYTES = 8 * 1024**2  # float64 bytes of images one step of `channel_stats_of` holds


def channel_stats_of(chunks: Iterable[np.ndarray]) -> tuple[tuple[float, ...],
                                                            tuple[float, ...]]:
    """Per-channel mean and (population) std of (B, C, H, W) chunks, accumulated in float64
    chunk by chunk (Chan's parallel update: no sum of squares to lose precision). A channel
    with no spread gets std 1, so normalising only centres it."""
    count, mean, m2 = 0, None, None
    for chunk in chunks:
        values = np.asarray(chunk, dtype=np.float64)
        if not len(values):
            continue
        n = values.size // values.shape[1]
        chunk_mean = values.mean(axis=(0, 2, 3))
        chunk_m2 = ((values - chunk_mean[None, :, None, None]) ** 2).sum(axis=(0, 2, 3))
        if mean is None:
            count, mean, m2 = n, chunk_mean, chunk_m2
            continue
        delta = chunk_mean - mean
        total = count + n
        mean = mean + delta * (n / total)
        m2 = m2 + chunk_m2 + delta ** 2 * (count * n / total)
        count = total
    if mean is None:
        raise DataError("no images to compute the per-channel mean and std of")
    std = np.sqrt(m2 / count)
    std = np.where(std > 0, std, 1.0)
    return tuple(float(m) for m in mean), tuple(float(s) for s in std)
