"""What `open_source` returns, `Records`: labelled images, in memory or read one at a time.

In-memory sources (digits, CIFAR, small folders) are `ImageDataset`s: one uint8 tensor at the
model's size. Streamed sources (large folders, Hugging Face datasets) are `ImageRecords`:
random access by index, each image decoded at its original resolution when it is read, so the
training transform (an Inception crop) sees the full image and memory stays flat in the size of
the set. Sets that cannot be indexed (a streamed Hugging Face `IterableDataset`) are
`IterableRecords`: read in order, sharded per rank, resumed by skipping.

Large scientific arrays (`data=arrays`) are `MappedArrays`: float images of one size read
batch by batch from their files (`images(indices)`), targets in memory.

Every kind has `name`, `classes`, `labels` (None for `IterableRecords`: known only as read) and
`streamed` (False for `ImageDataset` and `MappedArrays`: their images have one size and are
not decoded and resized as they are read). `vitkit.data.feeds` turns any of them into batches.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, runtime_checkable

import numpy as np

from vitkit.data.dataset import ImageDataset
from vitkit.data.image_decoder import DecodedImage
from vitkit.data.sources.mapped import MappedArrays


@runtime_checkable
class ImageRecords(Protocol):
    """A random-access set of labelled images, decoded one at a time.

    `read` never raises for a bad image: the `DecodedImage` says why it was refused, and the
    loader skips and counts it. `where(i)` names record i in messages and `skipped_files.txt`
    (a file path, or "hf:beans train[17]").
    """

    name: str
    classes: list[str]
    streamed: bool  # True: decoded from the files at their own resolution as they are read

    def __len__(self) -> int: ...

    @property
    def labels(self) -> np.ndarray:
        """Every record's label (int64, length len(self)), known without decoding images."""
        ...

    def read(self, index: int, channels: int) -> DecodedImage:
        """Record `index` decoded to an 8-bit image with `channels` (1: "L", 3: "RGB")."""
        ...

    def where(self, index: int) -> str: ...


@runtime_checkable
class IterableRecords(Protocol):
    """A labelled image stream read in order (no random access), e.g. a streamed Hub dataset.

    `iterate` yields (decoded image, label, where) for this rank's share of epoch `epoch`,
    shuffled with `seed` (a seeded buffer), after skipping the first `skip` records of that
    share (exact resume mid-epoch). `num_records` is the set's size when the source states it,
    else None.
    """

    name: str
    classes: list[str]
    num_records: int | None
    streamed: bool  # True
    labels: None  # known only as the stream is read

    def iterate(self, epoch: int, seed: int, rank: int, world_size: int, channels: int,
                skip: int = 0) -> Iterator[tuple[DecodedImage, int, str]]: ...


Records = ImageDataset | MappedArrays | ImageRecords | IterableRecords
