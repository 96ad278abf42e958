"""Which preprocessing a run trains with, evaluates with and saves in its checkpoints."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from vitkit.config import ViTConfig
from vitkit.data.transforms import evaluation_preprocess
from vitkit.preprocess import Preprocess
from vitkit.train.config import TrainConfig

STATS_CHUNK = 4096  # images per pass of `channel_stats` (float64 sums, bounded memory)


def run_preprocess(cfg: TrainConfig, config: ViTConfig, base: Preprocess | None,
                   streamed: bool, float_stats: tuple[list[float], list[float]] | None = None
                   ) -> Preprocess:
    """The run's preprocessing at the model's size: `base`, the pretrained weights' (or, on
    resume of a fine-tuning run, the one it trained with), else mean = std = 0.5 per channel;
    float arrays (`float_stats`: the training images' per-channel mean and std) are
    normalised with those, in the data's units (scale 1), never as 0-255 pictures. The
    config's mean/std replace those when set (for float arrays: in the data's units)."""
    size = list(config.img_size)
    if float_stats is not None:
        mean, std = float_stats
        pre = Preprocess(img_size=size, mean=mean, std=std, scale=1.0)
    elif base is not None:
        pre = base.replace(img_size=size)
    else:
        pre = evaluation_preprocess(size, config.in_chans, streamed, cfg.eval_crop_pct)
    if cfg.mean is not None and cfg.std is not None:
        pre = pre.replace(mean=list(cfg.mean), std=list(cfg.std))
    return pre


def channel_stats(train: Any) -> tuple[list[float], list[float]]:
    """Per-channel mean and (population) std of a data set's images, in their own units: a
    `channel_stats()` of the data's own when it has one (memory-mapped arrays), else over
    `train.images` (N, C, H, W) in chunks, summed in float64. A constant channel gets std 1
    (its values all normalise to 0)."""
    own = getattr(train, "channel_stats", None)
    if callable(own):
        mean, std = own()
        return [float(m) for m in mean], [float(s) for s in std]
    images = train.images
    channels = images.shape[1]
    total, squares, count = np.zeros(channels), np.zeros(channels), 0
    for flat in _channel_chunks(images):
        total += flat.sum(1).numpy()
        count += flat.shape[1]
    mean = total / max(count, 1)
    for flat in _channel_chunks(images):  # a second pass: no cancellation in E[x^2] - E[x]^2
        squares += (flat - torch.from_numpy(mean)[:, None]).pow(2).sum(1).numpy()
    std = np.sqrt(squares / max(count, 1))
    return mean.tolist(), np.where(std > 0, std, 1.0).tolist()


def _channel_chunks(images: Any) -> Iterator[torch.Tensor]:
    """(C, pixels) float64 views of `images` (N, C, H, W), `STATS_CHUNK` images at a time."""
    channels = images.shape[1]
    for start in range(0, len(images), STATS_CHUNK):
        chunk = images[start:start + STATS_CHUNK]
        chunk = chunk.double() if isinstance(chunk, torch.Tensor) else \
            torch.from_numpy(np.asarray(chunk, dtype=np.float64))
        yield chunk.transpose(0, 1).reshape(channels, -1)
