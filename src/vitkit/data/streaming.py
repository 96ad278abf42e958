"""Batches for training and evaluation, from in-memory data or streamed records.

A *feed* gives the Trainer its batches of uint8 images and labels:
- `MemoryFeed`: an in-memory `ImageDataset`; each step takes the global batch and the Trainer
  shards it across ranks after augmenting (so K processes see what one process would).
- `StreamFeed`: `ImageRecords` (large folders, Hugging Face datasets) decoded in DataLoader
  worker processes at their original resolution, each transformed (the Inception crop when
  training) to the model's size and packed into one uint8 batch inside the worker. Each rank
  reads only its own shard of every global batch.

Both follow `BatchOrder`: the order of epoch e is drawn from the seed, and the Inception crop of
image i in epoch e from (seed, e, i), so an epoch resumed at batch b reads exactly the batches
and crops the uninterrupted run would have, whatever the number of workers. Records that cannot
be decoded are left out of their batch, counted and named (`skipped_files`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from vitkit.data.dataset import ImageDataset
from vitkit.data.images import DecodedImage
from vitkit.data.loader import BatchOrder, shard
from vitkit.data.sources.records import ImageRecords, IterableRecords
from vitkit.data.transforms import EvalResize

logger = logging.getLogger("vitkit.data")

Transform = Callable[..., np.ndarray]  # (PIL image, numpy Generator) -> (C, H, W) uint8
_MAX_AUTO_WORKERS = 8


def auto_workers() -> int:
    """Loader processes when not set: one per CPU core this process may use, at most 8."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(cores or 1, _MAX_AUTO_WORKERS)


@dataclass
class Batch:
    """One batch as a worker packs it: images (n, C, H, W) uint8, labels (n,), and the records
    left out as (where, "kind: detail")."""

    images: torch.Tensor
    labels: torch.Tensor
    skipped: list[tuple[str, str]]

    def pin_memory(self) -> Batch:
        return Batch(self.images.pin_memory(), self.labels.pin_memory(), self.skipped)


def _pack(items: Iterable[tuple[DecodedImage, int, str, tuple[int, ...]]], capacity: int,
          transform: Transform, channels: int, size: tuple[int, int]) -> Batch:
    """Transform up to `capacity` decoded records, each (image, label, where, crop seed), into
    one `Batch`; refused images are left out and named."""
    out = torch.empty((capacity, channels, *size), dtype=torch.uint8)
    labels: list[int] = []
    skipped: list[tuple[str, str]] = []
    for decoded, label, where, seed in items:
        if decoded.image is None:
            skipped.append((where, decoded.reason))
            continue
        out[len(labels)] = torch.from_numpy(transform(decoded.image,
                                                      np.random.default_rng(seed)))
        labels.append(label)
    images = out if len(labels) == capacity else out[:len(labels)].clone()
    return Batch(images, torch.tensor(labels, dtype=torch.int64), skipped)


class _DecodedBatches(torch.utils.data.Dataset):
    """Reads a list of (epoch, index) keys into one `Batch` (runs in the worker processes)."""

    def __init__(self, records: ImageRecords, transform: Transform, channels: int,
                 size: tuple[int, int], seed: int) -> None:
        self.records, self.transform = records, transform
        self.channels, self.size, self.seed = channels, size, seed

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, key: tuple[int, int]) -> Batch:
        return self.__getitems__([key])

    def __getitems__(self, keys: list[tuple[int, int]]) -> Batch:
        labels = self.records.labels
        items = ((self.records.read(index, self.channels), int(labels[index]),
                  self.records.where(index), (self.seed, epoch, index))
                 for epoch, index in keys)
        return _pack(items, len(keys), self.transform, self.channels, self.size)


class _StreamedBatches(torch.utils.data.IterableDataset):
    """Reads an `IterableRecords` share in order into `Batch`es of `batch_size` records (the
    last one may be short), starting after `skip_batches` batches (one worker process)."""

    def __init__(self, records: IterableRecords, transform: Transform, channels: int,
                 size: tuple[int, int], seed: int, rank: int, world_size: int,
                 batch_size: int) -> None:
        self.records, self.transform = records, transform
        self.channels, self.size, self.seed = channels, size, seed
        self.rank, self.world_size, self.batch_size = rank, world_size, batch_size
        self.epoch, self.skip_batches = 0, 0

    def __iter__(self) -> Iterator[Batch]:
        skip = self.skip_batches * self.batch_size
        stream = self.records.iterate(self.epoch, self.seed, self.rank, self.world_size,
                                      self.channels, skip=skip)
        items = ((decoded, label, where, (self.seed, self.epoch, self.rank, position))
                 for position, (decoded, label, where) in enumerate(stream, skip))
        while True:  # batch_size records per batch, read lazily; the last one may be short
            batch = _pack(islice(items, self.batch_size), self.batch_size, self.transform,
                          self.channels, self.size)
            if not len(batch.labels) and not batch.skipped:
                return
            yield batch


def _single(batch: Batch) -> Batch:
    return batch  # the dataset packs whole batches: nothing to collate


class _EpochShards(Sampler[list[tuple[int, int]]]):
    """This rank's share of each global batch of one epoch, from batch `start` on."""

    def __init__(self, order: BatchOrder, rank: int, world_size: int) -> None:
        self.order, self.rank, self.world_size = order, rank, world_size
        self.epoch, self.start = 0, 0

    def __len__(self) -> int:
        return max(self.order.batches_per_epoch() - self.start, 0)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        for _, indices in self.order.iterate(self.epoch, self.start):
            mine = shard(indices, self.rank, self.world_size).tolist()
            yield [(self.epoch, i) for i in mine]


class _Chunks(Sampler[list[tuple[int, int]]]):
    """This rank's contiguous share of all records in fixed order, in chunks of `size`."""

    def __init__(self, count: int, size: int, rank: int, world_size: int) -> None:
        self.mine = shard(torch.arange(count), rank, world_size).tolist()
        self.size = size

    def __len__(self) -> int:
        return -(-len(self.mine) // self.size)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        for start in range(0, len(self.mine), self.size):
            yield [(0, i) for i in self.mine[start:start + self.size]]


def _loader(dataset: _DecodedBatches, sampler: Sampler, workers: int, pin_memory: bool,
            persistent: bool) -> DataLoader:
    return DataLoader(dataset, batch_sampler=sampler, num_workers=workers,
                      collate_fn=_single, pin_memory=pin_memory,
                      persistent_workers=persistent and workers > 0,
                      prefetch_factor=4 if workers > 0 else None)


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

    def epoch(self, epoch: int, start: int = 0
              ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        for index, indices in self.order.iterate(epoch, start):
            yield index, self.data.images[indices], self.data.labels[indices]

    @property
    def skipped_files(self) -> list[tuple[str, str]]:
        return list(self.data.skipped_files)

    def close(self) -> None:
        pass


class StreamFeed(_NamesSkips):
    """This rank's share of each global batch, decoded and transformed by worker processes."""

    global_batches = False

    def __init__(self, records: ImageRecords, order: BatchOrder, transform: Transform,
                 channels: int, size: tuple[int, int], seed: int, rank: int = 0,
                 world_size: int = 1, workers: int | None = None, pin_memory: bool = False
                 ) -> None:
        self.order = order
        self.sampler = _EpochShards(order, rank, world_size)
        self.workers = auto_workers() if workers is None else workers
        self.skips = SkipLog(records.name)
        dataset = _DecodedBatches(records, transform, channels, size, seed)
        self.loader = _loader(dataset, self.sampler, self.workers, pin_memory, persistent=True)

    def epoch(self, epoch: int, start: int = 0
              ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        self.sampler.epoch, self.sampler.start = epoch, start
        for index, batch in enumerate(self.loader, start):
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
        self.dataset = _StreamedBatches(records, transform, channels, size, seed, rank,
                                        world_size, local)
        self.pin_memory = pin_memory
        self.skips = SkipLog(records.name)

    def epoch(self, epoch: int, start: int = 0
              ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        self.dataset.epoch, self.dataset.skip_batches = epoch, start
        loader = DataLoader(self.dataset, batch_size=None, num_workers=1,
                            pin_memory=self.pin_memory, prefetch_factor=4)
        total = self.order.batches_per_epoch()
        for index, batch in enumerate(loader, start):
            if index >= total:
                break  # every rank trains the same number of steps per epoch
            self.skips.add(batch.skipped)
            yield index, batch.images, batch.labels

    def close(self) -> None:
        pass


class IterableEval(_NamesSkips):
    """Evaluation batches of `IterableRecords`: this rank's share, in the stream's order."""

    def __init__(self, records: IterableRecords, transform: Transform, channels: int,
                 size: tuple[int, int], pin_memory: bool = False) -> None:
        self.records, self.transform = records, transform
        self.channels, self.size, self.pin_memory = channels, size, pin_memory
        self.skips = SkipLog(records.name)
        self.classes, self.name = records.classes, records.name

    def eval_batches(self, batch_size: int, rank: int = 0, world_size: int = 1
                     ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        dataset = _StreamedBatches(self.records, self.transform, self.channels, self.size, 0,
                                   rank, world_size, batch_size)
        loader = DataLoader(dataset, batch_size=None, num_workers=1,
                            pin_memory=self.pin_memory)
        for batch in loader:
            self.skips.add(batch.skipped)
            if len(batch.labels):
                yield batch.images, batch.labels


class StreamEval(_NamesSkips):
    """Evaluation batches of `ImageRecords`: this rank's share in fixed order, through the
    evaluation transform (resize the shorter side, centre crop)."""

    def __init__(self, records: ImageRecords, transform: Transform, channels: int,
                 size: tuple[int, int], workers: int | None = None,
                 pin_memory: bool = False) -> None:
        self.records = records
        self.dataset = _DecodedBatches(records, transform, channels, size, seed=0)
        self.workers = auto_workers() if workers is None else workers
        self.pin_memory = pin_memory
        self.skips = SkipLog(records.name)
        self.classes = records.classes
        self.name = records.name

    def __len__(self) -> int:
        return len(self.records)

    @property
    def labels(self) -> torch.Tensor:
        return torch.from_numpy(np.asarray(self.records.labels, dtype=np.int64))

    def eval_batches(self, batch_size: int, rank: int = 0, world_size: int = 1
                     ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        sampler = _Chunks(len(self.records), batch_size, rank, world_size)
        loader = _loader(self.dataset, sampler, self.workers, self.pin_memory, persistent=False)
        for batch in loader:
            self.skips.add(batch.skipped)
            if len(batch.labels):
                yield batch.images, batch.labels



def to_memory(records: ImageRecords, size: tuple[int, int] | None, channels: int,
              workers: int | None = None, batch_size: int = 256) -> ImageDataset:
    """Decode every record into an in-memory `ImageDataset`, each resized to `size` (bilinear,
    as the in-memory folder loader does); unreadable records are skipped and named."""
    from vitkit.data.dataset import DataError
    from vitkit.preprocess import Preprocess

    if size is None:
        raise DataError(f"{records.name}: decoding a streamed set into memory needs the image "
                        "size to resize to")
    squash = EvalResize(Preprocess(img_size=size, mean=(0.5,) * channels,
                                   std=(0.5,) * channels))
    feed = StreamEval(records, squash, channels, size, workers)
    parts = list(feed.eval_batches(batch_size))
    if not parts:
        raise DataError(f"no readable images in {records.name}: all {len(records)} were "
                        f"skipped (e.g. {feed.skipped_files[:2]}); check the data")
    images = torch.cat([p[0] for p in parts])
    labels = torch.cat([p[1] for p in parts])
    return ImageDataset(images, labels, list(records.classes), records.name,
                        skipped=len(feed.skipped_files), skipped_files=feed.skipped_files)
