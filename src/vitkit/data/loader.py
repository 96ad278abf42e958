"""The order of training batches: seeded, resumable, sharded across ranks (every feed).

The order of epoch e is a permutation drawn from the seed `seed * 100003 + e`, so (epoch,
batch index) is all the state needed to resume exactly. Every rank draws the same global
batch and takes its own contiguous slice, so K processes see exactly the batches one process
would.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass
class BatchOrder:
    """Which samples make up each global batch of each epoch."""

    size: int
    batch_size: int
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = True

    def batches_per_epoch(self) -> int:
        full, rest = divmod(self.size, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def epoch_indices(self, epoch: int) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.size)
        generator = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        return torch.randperm(self.size, generator=generator)

    def iterate(self, epoch: int, start: int = 0) -> Iterator[tuple[int, torch.Tensor]]:
        """(batch index, global indices) from batch `start` to the end of the epoch."""
        order = self.epoch_indices(epoch)
        for index in range(start, self.batches_per_epoch()):
            yield index, order[index * self.batch_size:(index + 1) * self.batch_size]


def shard(indices: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This rank's contiguous slice of a global batch (sizes differ by at most one)."""
    bounds = torch.linspace(0, len(indices), world_size + 1).round().long().tolist()
    return indices[bounds[rank]:bounds[rank + 1]]
