"""Fine-tuning set-up: a pretrained model with a new zero head and resampled positions, and
vit_jax's training crop (resize, then a random window of the training size)."""

from __future__ import annotations

import logging
from typing import Any

import torch

from vitkit.catalog import read_weights
from vitkit.config import ViTConfig
from vitkit.data.transforms import resize_batch
from vitkit.errors import ConfigError
from vitkit.model.vit import VisionTransformer
from vitkit.preprocess import Preprocess
from vitkit.train.checkpoint import TrainCheckpoint
from vitkit.train.config import TrainConfig
from vitkit.weights import WeightsRecord, build_model

log = logging.getLogger(__name__)


def read_init(cfg: TrainConfig) -> WeightsRecord:
    """The weights named by `cfg.init_from`, read and converted (no model built yet)."""
    img_size = cfg.finetune_overrides().get("img_size")
    return read_weights(cfg.init_from, cfg.weights_dir, img_size=img_size)


PAPER_FINETUNE_SIZES = {(224, 224): (384, 384)}  # pretrained at 224 px, fine-tuned at 384


def default_img_size(pretrained: ViTConfig) -> tuple[int, int]:
    """The fine-tuning resolution when `model.img_size` is not set: the paper's 384 px for
    weights pretrained at 224 px, else the weights' own size (a 32-px CIFAR model stays at
    32 px rather than growing to 384 px = 9,216 tokens)."""
    size = tuple(pretrained.img_size)
    return PAPER_FINETUNE_SIZES.get(size, size)


def target_config(weights: WeightsRecord, overrides: dict[str, Any]) -> ViTConfig:
    """The checkpoint's config with the run's overrides (before the head is replaced); without
    an img_size override, at `default_img_size`."""
    fields = {k: v for k, v in overrides.items() if k != "num_classes"}
    fields.setdefault("img_size", default_img_size(weights.config))
    return weights.config.replace(**fields)


def pretrained_model(weights: WeightsRecord, cfg: TrainConfig, num_classes: int,
                     class_names: list[str] | None = None) -> VisionTransformer:
    """The model to fine-tune, in training mode.

    Position embeddings are resampled to `model.img_size` with `cfg.pos_interpolation` ("auto":
    the convention of the weights' format, see `vitkit.weights.resampling`); with
    `cfg.new_head` the classifier is replaced by a zero-initialised one of `num_classes`
    outputs and the pre-logits layer dropped, as in the paper's fine-tuning. Without it, a
    head that already has `num_classes` outputs is kept, output i for the data's class i
    (`class_names`): a warning names the first pair whose names differ.
    """
    overrides = cfg.finetune_overrides()
    asked = int(overrides.pop("num_classes", num_classes))
    names_its_outputs = cfg.data in ("folder", "arrays") or cfg.data.startswith("hf:")
    if asked != num_classes and names_its_outputs:
        raise ConfigError(f"model.num_classes={asked} but the data {cfg.data_dir or cfg.data} "
                          f"gives {num_classes} outputs (its classes or targets): leave "
                          "model.num_classes out, and the new head is sized from the data")
    num_classes = asked  # the digits and CIFAR: a head with spare outputs trains
    overrides.setdefault("img_size", default_img_size(weights.config))
    model = build_model(weights, cfg.pos_interpolation, **overrides)
    if cfg.new_head or num_classes != model.config.num_classes:
        model.reset_classifier(num_classes, zero_init=True)
        model.info = model.info.replace(class_names=None)
    elif class_names and model.class_names:
        warn_if_renamed(list(model.class_names), class_names)
    return model.train()


def warn_if_renamed(kept: list[str], data: list[str]) -> None:
    """With new_head=false the kept classifier's output i learns the data's class i: warn when
    the weights named that output otherwise (classes in another order, or other classes)."""
    pairs = [(i, old, new) for i, (old, new) in enumerate(zip(kept, data, strict=False))
             if old != new]
    if pairs:
        i, old, new = pairs[0]
        log.warning("new_head=false keeps the weights' classifier, and %d of its %d outputs "
                    "are named otherwise than the data's classes (output %d: %r in the "
                    "weights, %r in the data): each output is trained as the data's class "
                    "of its index. Keep new_head=true for a new head, or order the data's "
                    "classes as the weights' are (unless both name the same classes in other "
                    "words, as ImageNet's synset folders and its label words do)",
                    len(pairs), len(kept), i, old, new)


def config_from_run(state: TrainCheckpoint) -> tuple[ViTConfig, Preprocess]:
    """The model config (at the run's final resolution) and preprocessing of a fine-tuning
    run's checkpoint: what resuming builds, without reading `init_from` again."""
    trained = state.trained
    return trained.config.replace(img_size=trained.preprocess.img_size), trained.preprocess


def resize_random_crop(images: torch.Tensor, size: tuple[int, int], ratio: float,
                       generator: torch.Generator) -> torch.Tensor:
    """Resize a float batch to `ratio` x `size`, then crop a random `size` window per sample
    (one `gather`; offsets drawn from `generator`)."""
    height, width = size
    big = (max(height, round(height * ratio)), max(width, round(width * ratio)))
    x = resize_batch(images, big)
    b, c = x.shape[:2]
    oy = torch.randint(0, big[0] - height + 1, (b,), generator=generator)
    ox = torch.randint(0, big[1] - width + 1, (b,), generator=generator)
    rows = oy[:, None] + torch.arange(height)
    cols = ox[:, None] + torch.arange(width)
    index = (rows[:, :, None] * big[1] + cols[:, None, :]).view(b, 1, -1).expand(b, c, -1)
    return x.reshape(b, c, -1).gather(2, index.to(x.device)).view(b, c, height, width)
