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
    value = torch.tensor([1.0 if flag else 0.0], device=_comm_device())
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def min_over_ranks(value: int, info: DistInfo) -> int:
    """The smallest of every rank's `value` (so every rank follows one fitted schedule)."""
    if not info.enabled:
        return value
    least = torch.tensor([value], dtype=torch.int64, device=_comm_device())
    dist.all_reduce(least, op=dist.ReduceOp.MIN)
    return int(least.item())


def sum_over_ranks(loss_sum: float, images: int, info: DistInfo) -> tuple[float, int]:
    """A rank's training loss sum and image count, summed over every rank."""
    if not info.enabled:
        return loss_sum, images
    totals = torch.tensor([loss_sum, float(images)], dtype=torch.float64, device=_comm_device())
    dist.all_reduce(totals, op=dist.ReduceOp.SUM)
    return float(totals[0]), int(totals[1])


def gather_batch(images: torch.Tensor, labels: torch.Tensor,
                 info: DistInfo) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's share of a global batch, concatenated in rank order (the global batch;
    the shares may differ in size)."""
    if not info.enabled:
        return images, labels
    return _gather_rows(images), _gather_rows(labels)


def _gather_rows(rows: torch.Tensor) -> torch.Tensor:
    """`rows` of every rank, concatenated in rank order (on `rows`' device)."""
    comm = _comm_device()
    counts = [torch.zeros(1, dtype=torch.int64, device=comm) for _ in range(dist.get_world_size())]
    dist.all_gather(counts, torch.tensor([len(rows)], device=comm))
    sizes = [int(count.item()) for count in counts]
    padded = torch.zeros((max(sizes), *rows.shape[1:]), dtype=rows.dtype, device=comm)
    padded[:len(rows)] = rows.to(comm)
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded)
    return torch.cat([part[:size] for part, size in zip(parts, sizes, strict=True)]).to(rows.device)


def _comm_device() -> torch.device:
    """Where the process group's tensors live: the GPU for NCCL, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def cleanup(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()
