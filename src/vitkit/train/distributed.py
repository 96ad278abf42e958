"""torchrun / DistributedDataParallel helpers: gloo on CPU, NCCL on GPU."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device: torch.device) -> DistInfo:
    """Join the process group that `torchrun` describes in the environment (if any)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistInfo()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend=backend)
    return DistInfo(rank, world_size, local_rank)


def broadcast_flag(flag: bool, info: DistInfo) -> bool:
    """True on every rank when any rank says True (used to stop together)."""
    if not info.enabled:
        return flag
    value = torch.tensor([1.0 if flag else 0.0])
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def sum_over_ranks(loss_sum: float, images: int, info: DistInfo) -> tuple[float, int]:
    """A rank's training loss sum and image count, summed over every rank."""
    if not info.enabled:
        return loss_sum, images
    totals = torch.tensor([loss_sum, float(images)], dtype=torch.float64)
    dist.all_reduce(totals, op=dist.ReduceOp.SUM)
    return float(totals[0]), int(totals[1])


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def cleanup(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()
