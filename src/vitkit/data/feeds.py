"""Batches for training and evaluation: one protocol for each, in memory or streamed, so the
callers never ask which kind of data they got.

A `TrainingFeed` gives the training loop its batches of uint8 images and labels:
- `MemoryFeed`: an in-memory `ImageDataset`; each step takes the global batch and the loop
  shards it across ranks after augmenting (so K processes see what one process would).
- `MappedFeed`: `MappedArrays` (large `data=arrays` sets), each global batch's rows read from
  the files as float32 (no workers: a read is cheap), then as `MemoryFeed`.
- `StreamFeed`: `ImageRecords` (large folders, Hugging Face datasets) decoded in DataLoader
  worker processes at their original resolution, each transformed (the Inception crop) to the
  model's size and packed into one uint8 batch inside the worker (`vitkit.data.workers`).
  Each rank reads only its own shard of every global batch.
- `IterableFeed`: `IterableRecords` (a streamed Hugging Face dataset), read in order per rank.

All follow `BatchOrder`: the order of epoch e is drawn from the seed, and the Inception crop of
image i in epoch e from (seed, e, i), so an epoch resumed at batch b reads exactly the batches
and crops the uninterrupted run would have, whatever the number of workers. Records that cannot
be decoded are left out of their batch, counted and named (`skipped_files`).

Batches hold uint8 pictures, or float32 arrays in their own units (`data=arrays`).
An `EvaluationFeed` gives this rank's share of a held-out split in fixed order, as (images,
labels) batches: `MemoryEval` (the images as held), `MappedEval` (read from the files),
`StreamEval` / `IterableEval`
(each image through the evaluation transform, `EvalResize`, at the model's size). The caller
normalises them with the same `Preprocess` either way.

`training_feed` and `evaluation_feed` pick the kind for the data `open_source` returned.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader

from vitkit.data.dataset import ImageDataset
from vitkit.data.loader import BatchOrder, shard
from vitkit.data.sources.mapped import MappedArrays
from vitkit.data.sources.records import ImageRecords, IterableRecords, Records
from vitkit.data.transforms import EvalResize
from vitkit.data.workers import (
    Chunks,
    DecodedBatches,
    EpochShards,
    StreamedBatches,
    Transform,
    auto_workers,
    loader,
    own_generator,
)
from vitkit.errors import DataError
from vitkit.preprocess import Preprocess

__all__ = ["EvaluationFeed", "IterableEval", "IterableFeed", "MappedEval", "MappedFeed",
           "MemoryEval", "MemoryFeed",
           "SkipLog", "StreamEval", "StreamFeed", "TrainingFeed", "eval_batches",
           "evaluation_feed", "record_count", "training_feed"]

logger = logging.getLogger("vitkit.data")


class TrainingFeed(Protocol):
    """Training batches, epoch by epoch, resumable at any batch."""

    global_batches: bool  # True: whole global batches (the caller shards them after augmenting)
    order: BatchOrder

    def epoch(self, epoch: int, start_batch: int = 0
              ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        """(batch index, images, labels) from batch `start_batch` to the end of `epoch`
        (uint8 pictures, or float32 arrays in their own units)."""
        ...

    @property
    def skipped_files(self) -> list[tuple[str, str]]:
        """Every record left out so far, as (where, "kind: detail")."""
        ...

    def close(self) -> None: ...


class EvaluationFeed(Protocol):
    """A held-out split as (uint8 images, labels) batches, this rank's share in fixed order."""

    name: str
    classes: list[str]

    def __len__(self) -> int:
        """The number of records (0 for a stream that does not state its size)."""
        ...

    @property
    def labels(self) -> torch.Tensor | None:
        """Every record's label, or None when they are known only as the data is read."""
        ...

    @property
    def channels(self) -> int: ...

    @property
    def image_size(self) -> tuple[int, int]:
        """(H, W) of the images the batches hold."""
        ...

    def eval_batches(self, batch_size: int, rank: int = 0, world_size: int = 1
                     ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...

    @property
    def skipped_files(self) -> list[tuple[str, str]]: ...


class _NamesSkips:
    """A feed whose `skips` (a `SkipLog`) name the records it left out."""

    skips: SkipLog

    @property
    def skipped_files(self) -> list[tuple[str, str]]:
        return self.skips.as_list()


class SkipLog:
    """Records left out while streaming, each named once, with a warning for the first few."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.files: dict[str, str] = {}

    def add(self, skipped: list[tuple[str, str]]) -> None:
        for where, reason in skipped:
            if where not in self.files and len(self.files) < 5:
                logger.warning("%s: skipped %s (%s)", self.name, where, reason)
            self.files.setdefault(where, reason)

    def as_list(self) -> list[tuple[str, str]]:
        return list(self.files.items())


class MemoryFeed:
    """Global batches of an in-memory `ImageDataset` (sharded by the Trainer after augmenting)."""

    global_batches = True

    def __init__(self, data: ImageDataset, order: BatchOrder) -> None:
        self.data, self.order = data, order

    def epoch(self, epoch: int, start_batch: int = 0
              ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        for index, indices in self.order.iterate(epoch, start_batch):
            yield index, self.data.images[indices], self.data.labels[indices]

    @property
    def skipped_files(self) -> list[tuple[str, str]]:
        return list(self.data.skipped_files)

    def close(self) -> None:
        pass


class MappedFeed(MemoryFeed):
    """Global batches of `MappedArrays`, each read from the files (float32, the data's units);
    sharded by the Trainer after augmenting, as `MemoryFeed`."""

    data: MappedArrays

    def epoch(self, epoch: int, start_batch: int = 0
              ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        for index, indices in self.order.iterate(epoch, start_batch):
            yield index, self.data.images(indices), self.data.labels[indices]


class StreamFeed(_NamesSkips):
    """This rank's share of each global batch, decoded and transformed by worker processes."""

    global_batches = False

    def __init__(self, records: ImageRecords, order: BatchOrder, transform: Transform,
                 channels: int, size: tuple[int, int], seed: int, rank: int = 0,
                 world_size: int = 1, workers: int | None = None, pin_memory: bool = False
                 ) -> None:
        self.order = order
        self.sampler = EpochShards(order, rank, world_size)
        self.workers = auto_workers() if workers is None else workers
        self.skips = SkipLog(records.name)
        dataset = DecodedBatches(records, transform, channels, size, seed)
        self.loader = loader(dataset, self.sampler, self.workers, pin_memory, persistent=True)

    def epoch(self, epoch: int, start_batch: int = 0
              ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        self.sampler.epoch, self.sampler.start = epoch, start_batch
        for index, batch in enumerate(self.loader, start_batch):
            self.skips.add(batch.skipped)
            yield index, batch.images, batch.labels

    def close(self) -> None:
        iterator = getattr(self.loader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()


class IterableFeed(_NamesSkips):
    """Training batches of `IterableRecords` (a streamed Hugging Face dataset): each rank reads
    its own share in a seeded shuffled order, `batch_size / world_size` records per step; a
    resumed epoch skips the records of the batches already trained on."""

    global_batches = False

    def __init__(self, records: IterableRecords, order: BatchOrder, transform: Transform,
                 channels: int, size: tuple[int, int], seed: int, rank: int = 0,
                 world_size: int = 1, pin_memory: bool = False) -> None:
        self.order = order
        local = len(shard(torch.arange(order.batch_size), rank, world_size))
        self.dataset = StreamedBatches(records, transform, channels, size, seed, rank,
                                       world_size, local)
        self.pin_memory = pin_memory
        self.skips = SkipLog(records.name)

    def epoch(self, epoch: int, start_batch: int = 0
              ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        self.dataset.epoch, self.dataset.skip_batches = epoch, start_batch
        batches = DataLoader(self.dataset, batch_size=None, num_workers=1,
                             pin_memory=self.pin_memory, prefetch_factor=4,
                             generator=own_generator())
        total = self.order.batches_per_epoch()
        for index, batch in enumerate(batches, start_batch):
            if index >= total:
                break  # every rank trains the same number of steps per epoch
            self.skips.add(batch.skipped)
            yield index, batch.images, batch.labels

    def close(self) -> None:
        pass


class MemoryEval:
    """Evaluation batches of an in-memory `ImageDataset`, the images as held."""

    def __init__(self, data: ImageDataset) -> None:
        self.data = data
        self.name, self.classes = data.name, data.classes

    def __len__(self) -> int:
        return len(self.data)

    @property
    def labels(self) -> torch.Tensor:
        return self.data.labels

    @property
    def channels(self) -> int:
        return self.data.channels

    @property
    def image_size(self) -> tuple[int, int]:
        return self.data.image_size

    @property
    def skipped_files(self) -> list[tuple[str, str]]:
        return list(self.data.skipped_files)

    def eval_batches(self, batch_size: int, rank: int = 0, world_size: int = 1
                     ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        mine = shard(torch.arange(len(self.data)), rank, world_size)
        for start in range(0, len(mine), batch_size):
            chunk = mine[start:start + batch_size]
            yield self.data.images[chunk], self.data.labels[chunk]


class MappedEval(MemoryEval):
    """Evaluation batches of `MappedArrays`, each read from the files."""

    data: MappedArrays

    def eval_batches(self, batch_size: int, rank: int = 0, world_size: int = 1
                     ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        mine = shard(torch.arange(len(self.data)), rank, world_size)
        for start in range(0, len(mine), batch_size):
            chunk = mine[start:start + batch_size]
            yield self.data.images(chunk), self.data.labels[chunk]


class StreamEval(_NamesSkips):
    """Evaluation batches of `ImageRecords`: this rank's share in fixed order, through the
    evaluation transform (resize the shorter side, centre crop)."""

    def __init__(self, records: ImageRecords, transform: Transform, channels: int,
                 size: tuple[int, int], workers: int | None = None,
                 pin_memory: bool = False) -> None:
        self.records = records
        self.dataset = DecodedBatches(records, transform, channels, size, seed=0)
        self.workers = auto_workers() if workers is None else workers
        self.pin_memory = pin_memory
        self.skips = SkipLog(records.name)
        self.classes = records.classes
        self.name = records.name
        self.channels, self.image_size = channels, size

    def __len__(self) -> int:
        return len(self.records)

    @property
    def labels(self) -> torch.Tensor:
        labels = np.asarray(self.records.labels)
        return torch.from_numpy(labels.astype(np.float32 if labels.ndim == 2 else np.int64))

    def eval_batches(self, batch_size: int, rank: int = 0, world_size: int = 1
                     ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        sampler = Chunks(len(self.records), batch_size, rank, world_size)
        batches = loader(self.dataset, sampler, self.workers, self.pin_memory, persistent=False)
        for batch in batches:
            self.skips.add(batch.skipped)
            if len(batch.labels):
                yield batch.images, batch.labels


class IterableEval(_NamesSkips):
    """Evaluation batches of `IterableRecords`: this rank's share, in the stream's order."""

    def __init__(self, records: IterableRecords, transform: Transform, channels: int,
                 size: tuple[int, int], pin_memory: bool = False) -> None:
        self.records, self.transform = records, transform
        self.channels, self.size, self.pin_memory = channels, size, pin_memory
        self.skips = SkipLog(records.name)
        self.classes, self.name = records.classes, records.name
        self.image_size = size

    labels = None  # a stream's labels are known only as it is read

    def __len__(self) -> int:
        return self.records.num_records or 0

    def eval_batches(self, batch_size: int, rank: int = 0, world_size: int = 1
                     ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        dataset = StreamedBatches(self.records, self.transform, self.channels, self.size, 0,
                                  rank, world_size, batch_size)
        batches = DataLoader(dataset, batch_size=None, num_workers=1,
                             pin_memory=self.pin_memory, generator=own_generator())
        for batch in batches:
            self.skips.add(batch.skipped)
            if len(batch.labels):
                yield batch.images, batch.labels


def record_count(train: Records) -> int:
    """How many records an epoch has (what `BatchOrder` orders)."""
    if not isinstance(train, IterableRecords):
        return len(train)
    if train.num_records is None:
        raise DataError(f"{train.name} is streamed and does not state its size, so epochs "
                        "cannot be counted: use streaming=false (the dataset is prepared "
                        "locally and read by index), or a dataset whose split info gives "
                        "its number of examples")
    return train.num_records


def training_feed(train: Records, order: BatchOrder, crop: Transform, channels: int,
                  size: tuple[int, int], seed: int, rank: int = 0, world_size: int = 1,
                  workers: int | None = None, pin_memory: bool = False) -> TrainingFeed:
    """The training batches of `train` in `order`: in memory, or decoded by `workers` loader
    processes with `crop` (an `InceptionCrop` to `size`) applied to each image."""
    if isinstance(train, ImageDataset):
        return MemoryFeed(train, order)
    if isinstance(train, MappedArrays):
        return MappedFeed(train, order)
    if isinstance(train, IterableRecords):
        return IterableFeed(train, order, crop, channels, size, seed, rank, world_size,
                            pin_memory)
    return StreamFeed(train, order, crop, channels, size, seed, rank, world_size, workers,
                      pin_memory)


def evaluation_feed(test: Records, preprocess: Preprocess, channels: int,
                    workers: int | None = None, pin_memory: bool = False) -> EvaluationFeed:
    """The evaluation batches of `test`: in memory as held, or each image decoded and resized
    (and cropped) by `preprocess` to its size (`EvalResize`)."""
    if isinstance(test, ImageDataset):
        return MemoryEval(test)
    if isinstance(test, MappedArrays):
        return MappedEval(test)
    size = (int(preprocess.img_size[0]), int(preprocess.img_size[1]))
    logger.info("%s: each image resized to %dx%d by the preprocessing (resize_mode=%s)",
                test.name, *size, preprocess.resize_mode)
    resize = EvalResize(preprocess)
    if isinstance(test, IterableRecords):
        return IterableEval(test, resize, channels, size, pin_memory)
    return StreamEval(test, resize, channels, size, workers, pin_memory)


def eval_batches(data: EvaluationFeed, batch_size: int, rank: int = 0, world_size: int = 1
                 ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's share of `data` in fixed order, as (uint8 images, labels) batches."""
    return data.eval_batches(batch_size, rank, world_size)
