"""A measured guess of a training step's time before the first step runs.

The first step of a large run can take a minute (ViT-B/16 at 384 px, batch 512, on a CPU) and
the budget clock only times steps after it, so the run would be silent about its length until
then. `probe_step_rate` times one forward and backward pass of a few synthetic images (enough
tokens to keep the matrix products as efficient as a full batch's, at most the batch) and
scales it to the batch. The probe leaves the run as it found it: the random state is forked
(dropout, drop-path), the buffers are put back (a conv stem's BatchNorm statistics), and the
gradients go to `torch.autograd.grad`, not to `.grad`, so the optimizer, DDP's hooks and an
exact resume never see it.
"""

from __future__ import annotations

import math
import time

import torch

from vitkit.inference.bf16 import autocast_context
from vitkit.model.vit import VisionTransformer
from vitkit.train.setup import Run

# Token rows a probe's matrix products get: below this their per-image cost rises steeply.
PROBE_TOKENS = 4096


def probe_images(batch_size: int, tokens_per_image: int) -> int:
    """How many images the probe runs: PROBE_TOKENS' worth, at least one, at most the batch."""
    return max(1, min(batch_size, math.ceil(PROBE_TOKENS / max(tokens_per_image, 1))))


def probe_step_rate(model: VisionTransformer, batch_size: int, tokens_per_image: int,
                    device: torch.device, amp_dtype: torch.dtype | None) -> float:
    """Seconds per (token per image) of a training step of `batch_size` images, measured on
    a forward and backward pass of `probe_images` synthetic images at the model's current
    size (a one-image pass first warms the kernels up); the unit `RunPlan.estimate` takes."""
    count = probe_images(batch_size, tokens_per_image)
    config = model.config
    params = [p for p in model.parameters() if p.requires_grad]
    forked = [device] if device.type == "cuda" else []
    autocast = autocast_context(device, amp_dtype)
    seconds = 0.0
    # a conv stem's BatchNorm moves its running statistics and step counter in training mode
    buffers = [(buffer, buffer.detach().clone()) for buffer in model.buffers()]
    with torch.random.fork_rng(devices=forked):
        for images in (1, count):
            x = torch.zeros(images, config.in_chans, *config.img_size, device=device)
            _synchronize(device)
            start = time.perf_counter()
            with autocast():
                out = model(x).float()
            if params:
                torch.autograd.grad(out.square().mean(), params, allow_unused=True)
            _synchronize(device)
            seconds = time.perf_counter() - start
    with torch.no_grad():
        for buffer, saved in buffers:
            buffer.copy_(saved)
    return seconds * batch_size / count / tokens_per_image


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def first_estimate(run: Run) -> str:
    """The run's duration as a probe of one step foresees it (`RunPlan.estimate`'s line),
    said before the first step; the timed steps that follow refine it."""
    pos, info = run.position, run.info
    tokens = run.plan.tokens(tuple(run.model.config.img_size))
    per_rank = math.ceil(run.cfg.batch_size / info.world_size)
    rate = probe_step_rate(run.model, per_rank, tokens, run.device, run.amp_dtype)
    images = probe_images(per_rank, tokens)
    source = (f"foreseen from one forward and backward pass of {images:,} of the "
              f"{per_rank:,} images")
    return run.plan.estimate(pos.step, pos.total_steps, rate, run.cfg.time_budget, source)
