"""One optimisation step on a batch.

Augment; move the model to the step's resolution (progressive resizing: the optimizer's
moments of learned positions are resampled with them); resize, or resize and random-crop;
shard an in-memory batch across ranks; micro-batches with gradient accumulation under
autocast: the task's loss, backward; clip; check that loss and gradients are finite on every rank
before anything is updated; the optimizer step; the EMA.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass, field, replace

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.swa_utils import AveragedModel

from vitkit.data.augment import BatchAugment
from vitkit.data.loader import shard
from vitkit.data.transforms import resize_batch
from vitkit.inference.bf16 import autocast_context
from vitkit.model.posembed import resample_grid_embed
from vitkit.model.vit import VisionTransformer
from vitkit.preprocess import Preprocess
from vitkit.tasks import Task, make_task
from vitkit.train.checkpoint import Position
from vitkit.train.compiling import CompileClock, compile_for_training
from vitkit.train.config import TrainConfig
from vitkit.train.distributed import DistInfo, broadcast_flag, gather_batch
from vitkit.train.finetune import resize_random_crop
from vitkit.train.nonfinite import StepOutcome
from vitkit.train.plan import RunPlan


def training_model(model: nn.Module, info: DistInfo, device: torch.device,
                   compile: bool) -> nn.Module:
    """What the steps call: the model, in DDP under torchrun, compiled with compile=true
    (`model` stays the plain module that checkpoints and evaluation use)."""
    model = DistributedDataParallel(model) if info.enabled else model
    return compile_for_training(model, device) if compile else model


@dataclass
class TrainStep:
    """`step(images, labels, lr, position)`: one optimizer update (none when the loss or the
    gradients are not finite); returns the batch's mean loss and gradient norm. In-memory
    batches are global; streamed ones are this rank's share (`global_batches` False), which
    the ranks gather into the global batch. Either way the global batch is augmented (one
    draw of flips, crops, mixup pairs for all of it, as one process would) and then sharded."""

    cfg: TrainConfig
    model: VisionTransformer
    ema: AveragedModel | None
    optimizer: torch.optim.Optimizer
    augment: BatchAugment
    generator: torch.Generator
    preprocess: Preprocess
    plan: RunPlan
    info: DistInfo
    device: torch.device
    amp_dtype: torch.dtype | None
    compile_clock: CompileClock
    global_batches: bool
    # the resolution the last step trained at (progressive resizing only moves up)
    trained_size: tuple[int, int] | None = None
    task: Task = field(default_factory=make_task)  # its loss (classification: soft CE)
    train_model: nn.Module = field(init=False)

    def __post_init__(self) -> None:
        self.train_model = training_model(self.model, self.info, self.device, self.cfg.compile)

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, lr: float,
                 position: Position) -> StepOutcome:
        cfg = self.cfg
        if not self.global_batches:
            images, labels = gather_batch(images, labels, self.info)
        if len(labels) < self.info.world_size:  # every rank needs an image (unreadable
            return StepOutcome(0.0, 0.0, updated=False)  # records); all ranks skip together
        images, targets = self.augment(images, labels, self.generator, self.preprocess.mean,
                                       self.preprocess.std, self.preprocess.scale)
        size = self.plan.resolution_at(position.step, position.total_steps)
        last = self.trained_size
        if last is not None and size[0] * size[1] < last[0] * last[1]:
            size = last  # a re-fitted budget may move a stage boundary back: never shrink
        self.trained_size = size
        self.set_resolution(size)
        if cfg.resize_crop > 1:
            images = resize_random_crop(images, size, cfg.resize_crop, self.generator)
        else:
            images = resize_batch(images, size)
        per_rank = len(images) / self.info.world_size  # DDP averages ranks' gradients
        if self.info.enabled:
            images = shard(images, self.info.rank, self.info.world_size)
            targets = shard(targets, self.info.rank, self.info.world_size)
        images = images.to(self.device, non_blocking=True)
        targets = targets.to(self.device, non_blocking=True)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        total = self._forward_backward(images, targets, per_rank)
        # The total norm before clipping; with clip_grad=0 the factor is 1 (grads unchanged).
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.clip_grad or math.inf)
        outcome = StepOutcome(total / len(images), float(norm), images=len(images))
        if broadcast_flag(not outcome.finite, self.info):  # checked before the update
            self.optimizer.zero_grad(set_to_none=True)
            return replace(outcome, updated=False)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.update_parameters(self.model)
        return outcome

    def _forward_backward(self, images: torch.Tensor, targets: torch.Tensor,
                          per_rank: float) -> float:
        """Gradients of the global batch's mean loss, accumulated over `accum_steps`
        micro-batches (DDP syncs them once, at the last); the loss summed over this rank's
        images. Each rank's sum is divided by the global batch over the ranks (`per_rank`),
        not by its own share, so that DDP's average of the ranks' gradients is the global
        mean where the shares differ by one (an odd batch on 2 ranks: 16 and 17 images)."""
        micro_images = images.chunk(self.cfg.accum_steps)
        micro_targets = targets.chunk(self.cfg.accum_steps)
        total = 0.0
        self.compile_clock.start(micro_images[0].shape)
        for i, (x, y) in enumerate(zip(micro_images, micro_targets, strict=True)):
            last = i == len(micro_images) - 1
            sync = nullcontext() if last or not self.info.enabled else self.train_model.no_sync()
            with sync, autocast_context(self.device, self.amp_dtype)():
                loss = self.task.loss(self.train_model(x).float(), y)
                (loss * len(x) / per_rank).backward()
            total += loss.item() * len(x)
        self.compile_clock.stop()
        return total

    @torch.no_grad()
    def set_resolution(self, size: tuple[int, int]) -> None:
        """Move the model (and the optimizer's moments of learned positions) to `size`."""
        if tuple(self.model.config.img_size) == tuple(size):
            return
        old_grid = self.model.config.grid_size
        self.model.set_image_size(size)
        if self.ema is not None:
            self.ema.module.set_image_size(size)
        pos = self.model.pos_embed
        if isinstance(pos, torch.nn.Parameter) and pos in self.optimizer.state:
            for key, value in self.optimizer.state[pos].items():
                if torch.is_tensor(value) and value.dim() == 3:
                    moment = resample_grid_embed(value, old_grid, self.model.config.grid_size,
                                                 self.model.config.num_prefix_tokens, "bicubic")
                    if key.endswith("exp_avg_sq"):  # bicubic overshoots below zero; its
                        moment.clamp_(min=0)  # square root in AdamW must stay real
                    self.optimizer.state[pos][key] = moment
        if self.info.enabled and isinstance(pos, torch.nn.Parameter):
            self.train_model = training_model(self.model, self.info, self.device,
                                              self.cfg.compile)  # parameter shapes changed
