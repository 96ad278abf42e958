"""Which preprocessing a run trains with, evaluates with and saves in its checkpoints."""

from __future__ import annotations

from vitkit.config import ViTConfig
from vitkit.data.transforms import evaluation_preprocess
from vitkit.preprocess import Preprocess
from vitkit.train.config import TrainConfig


def run_preprocess(cfg: TrainConfig, config: ViTConfig, base: Preprocess | None,
                   streamed: bool) -> Preprocess:
    """The run's preprocessing at the model's size: `base`, the pretrained weights' (or, on
    resume of a fine-tuning run, the one it trained with), else mean = std = 0.5 per channel;
    the config's mean/std replace those when set."""
    size = list(config.img_size)
    if base is not None:
        pre = base.replace(img_size=size)
    else:
        pre = evaluation_preprocess(size, config.in_chans, streamed, cfg.eval_crop_pct)
    if cfg.mean is not None and cfg.std is not None:
        pre = pre.replace(mean=list(cfg.mean), std=list(cfg.std))
    return pre
