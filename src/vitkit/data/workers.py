"""Records decoded into batches by DataLoader worker processes: the machinery of the streamed
feeds (`vitkit.data.feeds`).

A worker reads the records of one batch (by index, or in order from a stream), transforms each
decoded image to the model's size (the Inception crop when training, `EvalResize` when
evaluating; the crop of record i in epoch e drawn from (seed, e, i)) and packs them into one
uint8 `Batch`, leaving out and naming the records that cannot be decoded. The samplers give
each rank its share of every global batch (`BatchOrder`), from any batch on.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from vitkit.data.image_decoder import DecodedImage
from vitkit.data.loader import BatchOrder, shard
from vitkit.data.sources.records import ImageRecords, IterableRecords

__all__ = ["Batch", "Chunks", "DecodedBatches", "EpochShards", "StreamedBatches", "Transform",
           "auto_workers", "loader"]

Transform = Callable[..., np.ndarray]  # (PIL image, numpy Generator) -> (C, H, W) uint8
_MAX_AUTO_WORKERS = 8


def auto_workers() -> int:
    """Loader processes when not set: one per CPU core this process may use, at most 8."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(cores or 1, _MAX_AUTO_WORKERS)


@dataclass
class Batch:
    """One batch as a worker packs it: images (n, C, H, W) uint8, labels (n,) int64 classes or
    (n, K) float32 targets, and the records left out as (where, "kind: detail")."""

    images: torch.Tensor
    labels: torch.Tensor
    skipped: list[tuple[str, str]]

    def pin_memory(self) -> Batch:
        return Batch(self.images.pin_memory(), self.labels.pin_memory(), self.skipped)


Label = int | np.ndarray  # a class index, or a float32 (K,) row of targets


def _labels(labels: list[Label], width: int | None) -> torch.Tensor:
    """int64 (n,) class indices, or float32 (n, K) target rows (`width` K)."""
    if width is None:
        return torch.tensor(labels, dtype=torch.int64)
    rows = np.stack(labels) if labels else np.empty((0, width), dtype=np.float32)
    return torch.from_numpy(rows.astype(np.float32))


def _pack(items: Iterable[tuple[DecodedImage, Label, str, tuple[int, ...]]], capacity: int,
          transform: Transform, channels: int, size: tuple[int, int],
          width: int | None = None) -> Batch:
    """Transform up to `capacity` decoded records, each (image, label, where, crop seed), into
    one `Batch`; refused images are left out and named. `width`: K for (K,) target rows, None
    for class indices."""
    out = torch.empty((capacity, channels, *size), dtype=torch.uint8)
    labels: list[Label] = []
    skipped: list[tuple[str, str]] = []
    for decoded, label, where, seed in items:
        if decoded.image is None:
            skipped.append((where, decoded.reason))
            continue
        out[len(labels)] = torch.from_numpy(transform(decoded.image,
                                                      np.random.default_rng(seed)))
        labels.append(label)
    images = out if len(labels) == capacity else out[:len(labels)].clone()
    return Batch(images, _labels(labels, width), skipped)


class DecodedBatches(torch.utils.data.Dataset):
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
        labels = np.asarray(self.records.labels)
        width = labels.shape[1] if labels.ndim == 2 else None
        items = ((self.records.read(index, self.channels),
                  labels[index] if width else int(labels[index]),
                  self.records.where(index), (self.seed, epoch, index))
                 for epoch, index in keys)
        return _pack(items, len(keys), self.transform, self.channels, self.size, width)


class StreamedBatches(torch.utils.data.IterableDataset):
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


class EpochShards(Sampler[list[tuple[int, int]]]):
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


class Chunks(Sampler[list[tuple[int, int]]]):
    """This rank's contiguous share of all records in fixed order, in chunks of `size`."""

    def __init__(self, count: int, size: int, rank: int, world_size: int) -> None:
        self.mine = shard(torch.arange(count), rank, world_size).tolist()
        self.size = size

    def __len__(self) -> int:
        return -(-len(self.mine) // self.size)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        for start in range(0, len(self.mine), self.size):
            yield [(0, i) for i in self.mine[start:start + self.size]]


def loader(dataset: DecodedBatches, sampler: Sampler, workers: int, pin_memory: bool,
           persistent: bool) -> DataLoader:
    """A DataLoader whose workers each pack one whole `Batch` per sampled key list."""
    return DataLoader(dataset, batch_sampler=sampler, num_workers=workers,
                      collate_fn=_single, pin_memory=pin_memory,
                      persistent_workers=persistent and workers > 0,
                      prefetch_factor=4 if workers > 0 else None, generator=own_generator())


def own_generator() -> torch.Generator:
    """The generator a DataLoader draws its workers' base seed from at each new iterator.
    Left to torch's global one, that draw moves the dropout and drop-path masks the model
    takes from it, by one draw per epoch begun, so a run resumed mid-epoch (one iterator
    fewer) would not be exact. The workers' seeds are unused: every random choice of a batch is
    seeded by the run's seed, epoch and position."""
    return torch.Generator().manual_seed(0)
