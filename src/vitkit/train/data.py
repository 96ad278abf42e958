"""A run's data, through vitkit.data: the sources opened, the head sized to the classes found,
the checks that the model can take them, the batch order, and the feeds that give the loop its
batches (in memory, or records decoded by DataLoader workers). Every call into the data API
that setting up a run makes is here, so a new data door swaps in at one place."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from vitkit.config import ViTConfig
from vitkit.data.augment import AugmentConfig
from vitkit.data.dataset import DataError
from vitkit.data.feeds import (
    EvaluationFeed,
    TrainingFeed,
    evaluation_feed,
    record_count,
    training_feed,
)
from vitkit.data.loader import BatchOrder
from vitkit.data.skipped import write_skipped_files
from vitkit.data.sources import Records, open_source
from vitkit.data.transforms import InceptionCrop
from vitkit.errors import ConfigError
from vitkit.preprocess import Preprocess
from vitkit.train.config import TrainConfig
from vitkit.train.distributed import DistInfo

log = logging.getLogger("vitkit.train")

Source = Records


@dataclass
class TrainingData:
    """What a run trains on (`feed`: batches in the order `order` draws) and evaluates on."""

    feed: TrainingFeed
    evaluation: EvaluationFeed
    order: BatchOrder
    class_names: list[str]
    streamed: bool

    def write_skipped(self, out_dir: Path, info: DistInfo) -> None:
        """Streamed data: name every record skipped so far in the run's skipped_files.txt."""
        if self.streamed and info.is_main:
            write_skipped_files(out_dir, self.feed, self.evaluation)


def open_data(cfg: TrainConfig, config: ViTConfig, out_dir: Path, info: DistInfo,
              train: Source | None = None, test: Source | None = None
              ) -> tuple[Source, Source, ViTConfig]:
    """The run's train and test data (`train`/`test` when given, else the config's source)
    and the model config with its head sized to them. In memory, every image that could not
    be read is named in the run folder at once."""
    if train is None or test is None:
        train, test = open_source(cfg.data, cfg.data_dir, config.img_size, config.in_chans,
                                  cfg.train_limit, cfg.test_limit, cfg.data_mode,
                                  cfg.train_split, cfg.split, cfg.streaming, cfg.workers)
    config = size_head_to_folder(cfg, config, train)
    if info.is_main and not train.streamed:
        write_skipped_files(out_dir, train, test)
    return train, test, config


def class_count(train: Source) -> int:
    """Outputs of a new head for `train`: its classes, else its largest label + 1."""
    return len(train.classes) or int(train.labels.max()) + 1


def check_data_fits(config: ViTConfig, train: Source, resize: bool = False) -> None:
    """Refuse data the model cannot take, naming the fix (`resize`: images of another size
    are resized to the model's, as when fine-tuning at a higher resolution). Streamed records
    are decoded to the model's channels and size, so only their labels are checked."""
    if train.labels is None:
        return  # a stream's labels are only known as it is read (its classes size the head)
    labels = torch.as_tensor(train.labels)
    top = int(labels.max())
    if top >= config.num_classes or int(labels.min()) < 0:
        raise DataError(f"labels run from {int(labels.min())} to {top} but the head has "
                        f"{config.num_classes} outputs: set model.num_classes={top + 1}")
    if train.streamed:
        return
    if train.channels != config.in_chans:
        raise DataError(f"the data has {train.channels} channel(s) but the model takes "
                        f"{config.in_chans}: set model.in_chans={train.channels}")
    if train.image_size != config.img_size and not resize:
        raise DataError(f"the images are {train.image_size[0]}x{train.image_size[1]} but the "
                        f"model takes {config.img_size[0]}x{config.img_size[1]}: set "
                        f"model.img_size={list(train.image_size)} (or resize the data)")


def size_head_to_folder(cfg: TrainConfig, config: ViTConfig, train: Source) -> ViTConfig:
    """A fresh run on `data=folder` or `data=hf:...`: the head has one output per class found.
    A `model.num_classes` set to another number is refused; left unset (a variant name, or a
    model dict without it), the head is sized from the data."""
    found = len(train.classes)
    named_classes = cfg.data == "folder" or cfg.data.startswith("hf:")
    if not named_classes or cfg.init_from or not found or config.num_classes == found:
        return config
    if isinstance(cfg.model, dict) and "num_classes" in cfg.model:
        shown = ", ".join(train.classes[:5]) + (", ..." if found > 5 else "")
        raise ConfigError(f"model.num_classes={config.num_classes} but the data "
                          f"{cfg.data_dir or cfg.data} holds {found} classes ({shown}): set "
                          f"model.num_classes={found} (or use a recipe whose model leaves "
                          "num_classes unset, and the head is sized from the data)")
    log.info("data=%s: %d classes found, the head has %d outputs", cfg.data, found, found)
    return config.replace(num_classes=found)


def augment_config(cfg: TrainConfig, streamed: bool) -> AugmentConfig:
    """The batched augmentation; on streamed data the Inception crop replaces the padded
    random crop."""
    augment = AugmentConfig(**cfg.augment)
    if streamed and augment.crop_padding:
        if "crop_padding" in cfg.augment:
            log.info("streamed data: the Inception crop replaces augment.crop_padding")
        augment = replace(augment, crop_padding=0)
    return augment


def feed_data(cfg: TrainConfig, train: Source, test: Source, config: ViTConfig,
              preprocess: Preprocess, info: DistInfo, device: torch.device) -> TrainingData:
    """The batch order of `train` and the feeds: memory, or DataLoader workers decoding
    records to `config`'s size and channels."""
    order = BatchOrder(record_count(train), cfg.batch_size, cfg.seed)
    if order.batches_per_epoch() == 0:
        raise DataError(f"{order.size} training images do not fill one batch of "
                        f"{cfg.batch_size}: lower batch_size")
    classes = train.classes  # the names the checkpoints store
    size = tuple(config.img_size)
    channels, pin = config.in_chans, device.type == "cuda"
    crop = InceptionCrop(size, tuple(cfg.crop_scale), tuple(cfg.crop_ratio),
                         preprocess.interpolation)
    if train.streamed and cfg.resize_crop > 1:
        log.info("streamed data: the Inception crop replaces resize_crop")
    feed = training_feed(train, order, crop, channels, size, cfg.seed, info.rank,
                         info.world_size, cfg.workers, pin)
    evaluation = evaluation_feed(test, preprocess, channels, cfg.workers, pin)
    return TrainingData(feed, evaluation, order, classes, train.streamed)
