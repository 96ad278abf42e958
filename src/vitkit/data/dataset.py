"""`ImageDataset`: decoded images held in memory as one tensor, with their targets."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch

from vitkit.errors import DataError

log = logging.getLogger("vitkit.data")


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
        return channel_stats_of((self.images[start:start + rows].numpy() / scale
                                 for start in range(0, len(self.images), rows)),
                                self.name or "the arrays")

    def subset(self, indices: torch.Tensor | slice) -> ImageDataset:
        """The images at `indices` (a slice or an index tensor), same classes."""
        return ImageDataset(self.images[indices], self.labels[indices], self.classes,
                            self.name, self.skipped, list(self.notes), list(self.skipped_files),
                            self.stored_dtype)


STATS_CHUNK_BYTES = 8 * 1024**2  # float64 bytes of images one step of `channel_stats_of` holds


# A value this many times the 99.9th percentile of its channel's magnitudes (or than 1 when
# that is 0) dominates the channel's mean and std: one 3e38 among 256 arrays of ones makes
# the mean 1e36, and every other value then normalises to the same number (`channel_stats_of`).
OUTLIER_RATIO = 1e4
STATS_SAMPLE = 2 ** 20  # per channel: the most values kept for the percentile


def channel_stats_of(chunks: Iterable[np.ndarray], where: str = "the arrays",
                     notes: list[str] | None = None
                     ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and (population) std of (B, C, H, W) chunks, accumulated in float64
    chunk by chunk (Chan's parallel update: no sum of squares to lose precision). A channel
    with no spread gets std 1, so normalising only centres it. A channel whose largest value
    dominates its statistics (`OUTLIER_RATIO`) is warned of, naming the image and the value
    (appended to `notes` instead, when given, for the caller to say when the statistics are
    used)."""
    count, mean, m2, images = 0, None, None, 0
    peak: np.ndarray | None = None  # per channel: largest |value|, its value and image
    peak_value: np.ndarray | None = None
    peak_image: np.ndarray | None = None
    samples: list[np.ndarray] = []
    for chunk in chunks:
        values = np.asarray(chunk, dtype=np.float64)
        if not len(values):
            continue
        n = values.size // values.shape[1]
        flat = values.transpose(1, 0, 2, 3).reshape(values.shape[1], -1)
        magnitude = np.abs(flat)
        at = magnitude.argmax(1)
        rows = np.arange(len(at))
        if peak is None:
            peak, peak_value = magnitude[rows, at], flat[rows, at]
            peak_image = images + at // (n // len(values))
        else:
            better = magnitude[rows, at] > peak
            peak = np.where(better, magnitude[rows, at], peak)
            peak_value = np.where(better, flat[rows, at], peak_value)
            peak_image = np.where(better, images + at // (n // len(values)), peak_image)
        samples.append(magnitude[:, ::max(1, n // 4096)].copy())  # not a view of the chunk
        if sum(sample.shape[1] for sample in samples) > STATS_SAMPLE:
            samples = [np.concatenate(samples, axis=1)[:, ::2]]
        images += len(values)
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
    note = _outlier_note(where, np.percentile(np.concatenate(samples, axis=1), 99.9, axis=1),
                         peak, peak_value, peak_image, mean, std)
    if note and notes is not None:
        notes.append(note)
    elif note:
        log.warning("%s", note)
    std = np.where(std > 0, std, 1.0)
    return tuple(float(m) for m in mean), tuple(float(s) for s in std)


def _outlier_note(where: str, typical: np.ndarray, peak: np.ndarray, value: np.ndarray,
                  image: np.ndarray, mean: np.ndarray, std: np.ndarray) -> str | None:
    """The warning for the first channel whose largest |value| is over `OUTLIER_RATIO` times
    its 99.9th-percentile magnitude (`typical`; 1 when that is 0); None when none is."""
    over = np.flatnonzero(peak > OUTLIER_RATIO * np.where(typical > 0, typical, 1.0))
    if not len(over):
        return None
    c = int(over[0])
    channel = f" in channel {c}" if len(peak) > 1 else ""
    return (f"warning: {where}: image {int(image[c])} holds {float(value[c]):g}{channel}, while "
            f"99.9% of the values there are within {float(typical[c]):g}: the per-channel mean "
            f"({float(mean[c]):g}) and std ({float(std[c]):g}) the model normalises with are "
            "then that value's, every other value normalises to about the same number, and the "
            f"model learns nothing. Clip or remove it (numpy.clip, or drop image "
            f"{int(image[c])}), or, when such values are meant, give the statistics yourself: "
            "mean=... std=... (one value per channel, in the data's units)")
