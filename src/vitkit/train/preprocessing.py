"""Which preprocessing a run trains with, evaluates with and saves in its checkpoints."""

from __future__ import annotations

from vitkit.config import ViTConfig
from vitkit.preprocess import Preprocess
from vitkit.train.config import TrainConfig


def run_preprocess(cfg: TrainConfig, config: ViTConfig, base: Preprocess | None,
                   streamed: bool) -> Preprocess:
    """The run's preprocessing at the model's size: `base`, the pretrained weights' (or, on
    resume of a fine-tuning run, the one it trained with), else mean = std = 0.5 per channel;
    the config's mean/std replace those when set."""
    size = list(config.img_size)
    channels = (0.5,) * config.in_chans
    if base is not None:
        pre = base.replace(img_size=size)
    elif streamed:  # full-size images: shorter side to size / crop_pct, centre crop
        pre = Preprocess(img_size=size, resize_mode="shorter_side",
                         crop_pct=cfg.eval_crop_pct, mean=channels, std=channels)
    else:
        pre = Preprocess(img_size=size, mean=channels, std=channels)
    if cfg.mean is not None and cfg.std is not None:
        pre = pre.replace(mean=list(cfg.mean), std=list(cfg.std))
    return pre
