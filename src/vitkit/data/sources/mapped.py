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

import logging
from collections.abc import Iterator

import numpy as np
import torch

from vitkit.data.dataset import STATS_CHUNK_BYTES, ImageDataset, channel_stats_of
from vitkit.data.sources.npy_rows import ArrayFile
from vitkit.errors import DataError

log = logging.getLogger("vitkit.data")

__all__ = ["MappedArrays", "as_nchw", "beyond_float32", "first_unfit", "geometry"]


BEYOND_FLOAT32 = ("holds values beyond float32's range (|x| > 3.4e38), which would read as inf; "
                  "rescale the data (other units, or a log)")


def geometry(shape: tuple[int, ...], channels_last: bool) -> tuple[int, tuple[int, int]]:
    """(channels, (H, W)) of images stored with `shape` ((N, H, W), (N, C, H, W) or, when
    `channels_last`, (N, H, W, C))."""
    if len(shape) == 3:
        return 1, (shape[1], shape[2])
    if channels_last:
        return shape[3], (shape[1], shape[2])
    return shape[1], (shape[2], shape[3])


def as_nchw(images: np.ndarray, channels_last: bool) -> np.ndarray:
    """(B, H, W), (B, C, H, W) or channels-last (B, H, W, C) rows -> float32 (B, C, H, W)
    (values beyond float32's range become inf, which `first_unfit` refuses beforehand)."""
    if images.ndim == 3:
        images = images[:, None]
    elif channels_last:
        images = images.transpose(0, 3, 1, 2)
    with np.errstate(over="ignore"):
        return np.ascontiguousarray(images, dtype=np.float32)


def first_unfit(images: np.ndarray) -> tuple[int, str] | None:
    """The first row of `images` that float32 cannot carry, and what it holds with its fix
    (the end of a message: "image 3 " + it): NaN or inf, or, in float64 (or wider) data,
    values beyond float32's range, which would read as inf. None: all fit, or not floats."""
    if not np.issubdtype(images.dtype, np.floating):
        return None
    rows = images.reshape(len(images), -1)
    bad = ~np.isfinite(rows).all(axis=1)
    if bad.any():
        return int(np.argmax(bad)), "holds NaN or inf values; drop or fix it (numpy.nan_to_num)"
    if rows.dtype.itemsize > 4:
        bad = beyond_float32(rows)
        if bad.any():
            return int(np.argmax(bad)), BEYOND_FLOAT32
    return None


def beyond_float32(values: np.ndarray) -> np.ndarray:
    """Per row of finite float `values` (N, ...): whether one is beyond float32's range, that
    is, reads as inf when cast (|x| > 3.4e38; float32's largest value itself fits)."""
    with np.errstate(over="ignore"):
        return np.isinf(values.reshape(len(values), -1).astype(np.float32)).any(axis=1)


class MappedArrays:
    """Images read from `source` by rows, with their targets in memory.

    `labels` the targets (int64 (N,) classes, or float32 (N, K)); `classes` their names ([]
    when the files name none); `channels_last`: the file holds (N, H, W, C); `stored_dtype`:
    the file's numpy dtype (`ImageDataset.stored_dtype`).
    """

    streamed = False  # one size and channel count, as held: not decoded as read
    float_images = True  # read as float32 in the data's own units
    skipped = 0

    def __init__(self, source: ArrayFile, labels: torch.Tensor, classes: list[str],
                 name: str, channels_last: bool = False, count: int | None = None,
                 stored_dtype: str = "") -> None:
        self.source, self.classes, self.name = source, classes, name
        self.stored_dtype = stored_dtype
        self.channels_last = channels_last
        self.count = len(source) if count is None else min(count, len(source))
        self._labels = labels[:self.count]
        self.skipped_files: list[tuple[str, str]] = []
        self.notes: list[str] = []
        self._stats: tuple[tuple[float, ...], tuple[float, ...]] | None = None
        self._stats_notes: list[str] = []  # said when the statistics are asked for

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
        """Refuse images holding NaN or inf (or values float32 cannot hold), naming the first
        (one pass over the file, which also gives `channel_stats`)."""
        if not np.issubdtype(self.source.dtype, np.floating):
            return
        self._stats_notes = []
        self._stats = channel_stats_of(self._checked_chunks(), self.name, self._stats_notes)

    def _checked_chunks(self) -> Iterator[np.ndarray]:
        """Every chunk as float32 (B, C, H, W), each refused first if float32 cannot carry it
        (`first_unfit`)."""
        for start, chunk in self._chunks():
            unfit = first_unfit(chunk)
            if unfit is not None:
                raise DataError(f"{self.name}: image {start + unfit[0]} {unfit[1]}")
            yield as_nchw(chunk, self.channels_last)

    def channel_stats(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Per-channel (mean, std) of the images in their own units, accumulated in float64
        over chunks read from the file (`vitkit.data.dataset.channel_stats_of`)."""
        if self._stats is None:
            self._stats = channel_stats_of((as_nchw(chunk, self.channels_last)
                                            for _, chunk in self._chunks()), self.name)
        for note in self._stats_notes:  # found by `check_finite`'s pass
            log.warning("%s", note)
        self._stats_notes = []
        return self._stats

    def subset(self, count: int) -> MappedArrays:
        """The first `count` records."""
        return MappedArrays(self.source, self._labels, self.classes, self.name,
                            self.channels_last, count, self.stored_dtype)

    def load(self) -> ImageDataset:
        """Every image read into memory as an `ImageDataset` (float32)."""
        images = np.empty((self.count, self.channels, *self.image_size), dtype=np.float32)
        rows, start = self._chunk_rows(), 0
        for chunk in self._checked_chunks():
            images[start:start + rows] = chunk
            start += rows
        return ImageDataset(torch.from_numpy(images), self._labels, self.classes, self.name,
                            stored_dtype=self.stored_dtype)
