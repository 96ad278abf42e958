"""Which preprocessing a run trains with, evaluates with and saves in its checkpoints."""

from __future__ import annotations

import logging
from typing import Any

from vitkit.config import ViTConfig
from vitkit.data.transforms import evaluation_preprocess
from vitkit.preprocess import Preprocess
from vitkit.train.config import TrainConfig

log = logging.getLogger("vitkit.train")


def run_preprocess(cfg: TrainConfig, config: ViTConfig, base: Preprocess | None,
                   streamed: bool, float_stats: tuple[list[float], list[float]] | None = None
                   ) -> Preprocess:
    """The run's preprocessing at the model's size: `base`, the pretrained weights' (or, on
    resume of a fine-tuning run, the one it trained with), else mean = std = 0.5 per channel;
    float arrays (`float_stats`: the training images' per-channel mean and std) are
    normalised with those, in the data's units (scale 1), never as 0-255 pictures; 8-bit
    pictures from weights trained on such arrays (`base` of scale 1) get a fresh run's
    preprocessing, as their 0-255 values are no arrays' units. The config's mean/std replace
    those when set (for float arrays: in the data's units)."""
    size = list(config.img_size)
    if float_stats is not None:
        mean, std = float_stats
        pre = Preprocess(img_size=size, mean=mean, std=std, scale=1.0)
    elif base is not None and base.scale != 255:
        log.info("the weights were trained on arrays in their data's own units (their "
                 "preprocessing divides by %g); this data is 8-bit pictures, normalised as a "
                 "fresh run's are (0-255 to [0, 1], mean = std = 0.5)", base.scale)
        pre = evaluation_preprocess(size, config.in_chans, streamed, cfg.eval_crop_pct)
    elif base is not None:
        pre = base.replace(img_size=size)
    else:
        pre = evaluation_preprocess(size, config.in_chans, streamed, cfg.eval_crop_pct)
    if cfg.mean is not None and cfg.std is not None:
        pre = pre.replace(mean=list(cfg.mean), std=list(cfg.std))
    return pre


def channel_stats(train: Any) -> tuple[list[float], list[float]]:
    """Per-channel mean and (population) std of a data set's float images, in their own units
    (`channel_stats()` of the in-memory or memory-mapped arrays: float64, chunk by chunk). A
    constant channel gets std 1 (its values all normalise to 0)."""
    mean, std = train.channel_stats()
    return [float(m) for m in mean], [float(s) for s in std]
