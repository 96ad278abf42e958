"""Will a run fit in memory? An estimate made before anything is allocated, so a resolution
or batch that cannot fit is refused in a second instead of failing with out-of-memory later.

The estimate of one training step (fp32, the optimizer's moments included):

    parameters   params x 4 bytes x 4 (weights, gradients, two AdamW moments)
    activations  depth x micro-batch x tokens x (10 x width + 2 x mlp_dim) x 4 bytes
                 (what each block keeps for the backward pass: norms, q/k/v, projections,
                 the MLP's hidden layer before and after GELU)
    attention    depth x micro-batch x heads x tokens^2 x 2 x 4 bytes (scores, softmax)
    images       batch x channels x height x width x 4 bytes x 3 (augmented, resized, crop)

It is a rough guide (the allocator, threads and data add to it), used only to refuse runs
whose estimate exceeds the memory available.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from vitkit.catalog import count_parameters
from vitkit.config import ViTConfig
from vitkit.errors import ConfigError

FLOAT = 4


def training_bytes(config: ViTConfig, batch_size: int, accum_steps: int = 1,
                   world_size: int = 1) -> int:
    """Estimated peak bytes of one training step of `config` on one device."""
    micro = max(batch_size // (accum_steps * world_size), 1)
    tokens = config.seq_len
    params = count_parameters(config) * FLOAT * 4
    per_token = 10 * config.width + 2 * config.mlp_dim
    activations = config.depth * micro * tokens * per_token * FLOAT
    attention = config.depth * micro * config.num_heads * tokens**2 * 2 * FLOAT
    images = batch_size // world_size * config.in_chans * config.img_size[0] * \
        config.img_size[1] * FLOAT * 3
    return params + activations + attention + images


def available_bytes(device: torch.device) -> int | None:
    """Free memory for a run on `device`: the GPU's free memory on CUDA, else the system's
    available memory (/proc/meminfo's MemAvailable); None where it cannot be read."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_fits_in_memory(config: ViTConfig, batch_size: int, accum_steps: int,
                         device: torch.device, world_size: int = 1) -> int:
    """Refuse a run whose estimate exceeds the memory available, naming both and the fix;
    the estimate in bytes otherwise."""
    try:
        need = training_bytes(config, batch_size, accum_steps, world_size)
    except RuntimeError:  # a position table too large for torch to size (e.g. a 1e9 px side)
        need = math.inf
    have = available_bytes(device)
    if have is not None and need > have:
        size = "x".join(str(side) for side in config.img_size)
        amount = f"about {need / 2**30:.1f} GiB" if math.isfinite(need) else \
            "more memory than any machine has"
        raise ConfigError(
            f"this run needs {amount} ({size} px images = "
            f"{config.seq_len:,} tokens each, batch {batch_size} in {accum_steps} "
            f"micro-batch(es), width {config.width}, depth {config.depth}) but {device.type} "
            f"has {have / 2**30:.1f} GiB available: lower batch_size or raise accum_steps "
            "(activations scale with the micro-batch), or lower model.img_size or the "
            "resolution_schedule's sides (the token count, and attention's memory with its "
            "square)")
    return need
