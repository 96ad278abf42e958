"""`MappedArrays`: a large `data=arrays` split read from its file batch by batch, so memory
stays flat in the number of samples.

The images stay in their file (a `.npy`, or an uncompressed member of an `.npz`); each batch
reads just its rows (`ArrayFile.rows`: `os.pread`, no long-lived mapping whose touched pages
would add up in RSS) and converts them to float32 (B, C, H, W) in the data's own units. The
targets are small and held in memory. Like an `ImageDataset` the images have one size and
channel count (`streamed` is False: they are not decoded and resized as they are read), so
the training code treats both alike; `vitkit.data.feeds` gives their batches.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from vitkit.data.dataset import STATS_CHUNK_BYTES, ImageDataset, channel_stats_of
from vitkit.data.sources.arrayfile import ArrayFile
from vitkit.errors import DataError

__all__ = ["MappedArrays", "as_nchw", "first_nonfinite", "geometry"]


def geometry(shape: tuple[int, ...], channels_last: bool) -> tuple[int, tuple[int, int]]:
    """(channels, (H, W)) of images stored with `shape` ((N, H, W), (N, C, H, W) or, when
    `channels_last`, (N, H, W, C))."""
    if len(shape) == 3:
        return 1, (shape[1], shape[2])
    if channels_last:
        return shape[3], (shape[1], shape[2])
    return shape[1], (shape[2], shape[3])


def as_nchw(images: np.ndarray, channels_last: bool) -> np.ndarray:
    """(B, H, W), (B, C, H, W) or channels-last (B, H, W, C) rows -> float32 (B, C, H, W)."""
    if images.ndim == 3:
        images = images[:, None]
    elif channels_last:
        images = images.transpose(0, 3, 1, 2)
    return np.ascontiguousarray(images, dtype=np.float32)


def first_nonfinite(images: np.ndarray) -> int | None:
    """The first row of `images` holding NaN or inf (None: all finite, or not floats)."""
    if not np.issubdtype(images.dtype, np.floating):
        return None
    bad = ~np.isfinite(images.reshape(len(images), -1)).all(axis=1)
    return int(np.argmax(bad)) if bad.any() else None


class MappedArrays:
    """Images read from `source` by rows, with their targets in memory.

    `labels` the targets (int64 (N,) classes, or float32 (N, K)); `classes` their names ([]
    when the files name none); `channels_last`: the file holds (N, H, W, C).
    """

    streamed = False  # one size and channel count, as held: not decoded as read
    float_images = True  # read as float32 in the data's own units
    skipped = 0

    def __init__(self, source: ArrayFile, labels: torch.Tensor, classes: list[str],
                 name: str, channels_last: bool = False, count: int | None = None) -> None:
        self.source, self.classes, self.name = source, classes, name
        self.channels_last = channels_last
        self.count = len(source) if count is None else min(count, len(source))
        self._labels = labels[:self.count]
        self.skipped_files: list[tuple[str, str]] = []
        self.notes: list[str] = []
        self._stats: tuple[tuple[float, ...], tuple[float, ...]] | None = None

    def __len__(self) -> int:
        return self.count

    @property
    def labels(self) -> torch.Tensor:
        return self._labels

    @property
    def channels(self) -> int:
        return geometry(self.source.shape, self.channels_last)[0]

    @property
    def image_size(self) -> tuple[int, int]:
        return geometry(self.source.shape, self.channels_last)[1]

    def images(self, indices: torch.Tensor | np.ndarray | list[int]) -> torch.Tensor:
        """The images at `indices` as one float32 (B, C, H, W) batch, in that order."""
        rows = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(rows) and (rows.min() < 0 or rows.max() >= self.count):
            raise IndexError(f"{self.name}: indices {rows.min()}..{rows.max()} outside "
                             f"0..{self.count - 1}")
        return torch.from_numpy(as_nchw(self.source.rows(rows), self.channels_last))

    def _chunk_rows(self) -> int:
        per_image = max(1, self.source.row_bytes // self.source.dtype.itemsize)
        return max(1, STATS_CHUNK_BYTES // (8 * per_image))

    def _chunks(self) -> Iterator[tuple[int, np.ndarray]]:
        """(first index, rows) of every chunk, in order."""
        rows = self._chunk_rows()
        return zip(range(0, self.count, rows), self.source.chunks(rows, self.count),
                   strict=True)

    def check_finite(self) -> None:
        """Refuse images holding NaN or inf, naming the first (one pass over the file, which
        also gives `channel_stats`)."""
        if not np.issubdtype(self.source.dtype, np.floating):
            return
        def checked():
            for start, chunk in self._chunks():
                bad = first_nonfinite(chunk)
                if bad is not None:
                    raise DataError(f"{self.name}: image {start + bad} holds NaN or inf "
                                    "values; drop or fix it (e.g. numpy.nan_to_num)")
                yield as_nchw(chunk, self.channels_last)

        self._stats = channel_stats_of(checked())

    def channel_stats(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Per-channel (mean, std) of the images in their own units, accumulated in float64
        over chunks read from the file (`vitkit.data.dataset.channel_stats_of`)."""
        if self._stats is None:
            self._stats = channel_stats_of(as_nchw(chunk, self.channels_last)
                                           for _, chunk in self._chunks())
        return self._stats

    def subset(self, count: int) -> MappedArrays:
        """The first `count` records."""
        return MappedArrays(self.source, self._labels, self.classes, self.name,
                            self.channels_last, count)

    def load(self) -> ImageDataset:
        """Every image read into memory as an `ImageDataset` (float32)."""
        images = np.empty((self.count, self.channels, *self.image_size), dtype=np.float32)
        rows = self._chunk_rows()
        for start, chunk in self._chunks():
            images[start:start + rows] = as_nchw(chunk, self.channels_last)
        return ImageDataset(torch.from_numpy(images), self._labels, self.classes, self.name)
