"""A run's data, through vitkit.data: the sources opened, the task decided from the training
targets (`vitkit.tasks.infer_task`), the head sized to the classes or targets found (and, for
data=arrays, the input channels), the checks that the model can take them, the augmentation
the data and task allow, the batch order, and the feeds that give the loop its batches (in
memory, or records decoded by DataLoader workers). Every call into the data API that setting
up a run makes is here, so a new data door swaps in at one place."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from vitkit.config import ViTConfig, patch_sizes_in_words
from vitkit.data.augment import PICTURE_ONLY, AugmentConfig
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
from vitkit.tasks import TaskSpec, infer_task, make_task
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
              train: Source | None = None, test: Source | None = None,
              saved_task: TaskSpec | None = None, resumed: bool = False
              ) -> tuple[Source, Source, ViTConfig, TaskSpec]:
    """The run's train and test data (`train`/`test` when given, else the config's source),
    its task (`saved_task`: a resumed run's own) and the model config with its head (and,
    for data=arrays, its input channels) sized to them; a `resumed` run keeps its checkpoint's
    (a run of an older vitkit may have a head the data would not size). In memory, every
    image that could not be read is named in the run folder at once."""
    if train is None or test is None:
        train, test = open_source(cfg.data, cfg.data_dir, config.img_size, config.in_chans,
                                  cfg.train_limit, cfg.test_limit, cfg.data_mode,
                                  cfg.train_split, cfg.split, cfg.streaming, cfg.workers,
                                  saved_task.kind if saved_task else cfg.task)
    task = decide_task(cfg, train, saved_task)
    check_held_out_targets(test, task, test.name or cfg.data)
    if not resumed:
        config = make_task(task).size_head(cfg, config, train, test)
        config = channels_from_arrays(cfg, config, train)
    if info.is_main and not train.streamed:
        write_skipped_files(out_dir, train, test)
    return train, test, config, task


def decide_task(cfg: TrainConfig, train: Source, saved: TaskSpec | None = None) -> TaskSpec:
    """The run's task, decided once from the training targets: `cfg.task` (None: inferred)
    and `cfg.loss` checked against them; regression gets the targets' mean and std. A
    resumed run keeps its checkpoint's task exactly; a stream whose labels are known only as
    it is read is classification."""
    if saved is not None:
        for key, value in (("task", saved.kind), ("loss", saved.loss)):
            asked = getattr(cfg, key)
            if asked is not None and asked != value:
                raise ConfigError(f"{key}={asked} but the checkpoint was trained with {key}="
                                  f"{value}: resume with {key}={value} (or start a new run)")
        return saved
    names = list(train.classes) or None
    if train.labels is None:
        streamed = make_task(cfg.task)  # None: classification, whose classes a stream names
        if not streamed.class_labels:
            raise ConfigError(f"task={cfg.task} needs targets known before training, but "
                              f"streaming=true reads {cfg.data} as it trains: drop streaming "
                              "(or train task=classification)")
        return TaskSpec(streamed.kind, names=names, loss=cfg.loss)
    return infer_task(train.labels, cfg.task, names=names,
                      where=f"the training targets of {train.name or cfg.data}", loss=cfg.loss)


def check_held_out_targets(test: Source, task: TaskSpec, where: str) -> None:
    """Refuse held-out targets the run's task cannot score, as the training targets are
    (`infer_task`): class indices that are negative or not whole, multi-label targets other
    than 0 and 1 (scikit-learn refuses to score those); else the first evaluation fails or
    scores them silently."""
    labels = getattr(test, "labels", None)
    if labels is not None:
        make_task(task).check_held_out(labels, where)


def output_count(train: Source, task: TaskSpec, test: Source | None = None) -> int:
    """Outputs of a new head for `train` and its task: classes (labels that name none: the
    indices of both splits), targets or labels."""
    return make_task(task).output_count(train, test)


def check_data_fits(config: ViTConfig, train: Source, resize: bool = False,
                    task: TaskSpec | None = None) -> None:
    """Refuse data the model cannot take, naming the fix (`resize`: images of another size
    are resized to the model's, as when fine-tuning at a higher resolution). Streamed records
    are decoded to the model's channels and size, so only their labels are checked."""
    if train.labels is None:
        return  # a stream's labels are only known as it is read (its classes size the head)
    make_task(task).check_training_labels(config.num_classes, train)
    if train.streamed:
        return
    channels_differ = train.channels != config.in_chans
    size_differs = train.image_size != config.img_size and not resize
    if channels_differ and size_differs:  # a variant name on small data: every fix at once
        (height, width), (model_height, model_width) = train.image_size, config.img_size
        raise DataError(f"the data is {height}x{width} with {train.channels} channel(s) but "
                        f"the model takes {model_height}x{model_width} with "
                        f"{config.in_chans}: set model.in_chans={train.channels} "
                        f"model.img_size={_size_value(train.image_size)}"
                        + _patch_size_fix(config, train.image_size)
                        + _channels_last_hint(train))
    if channels_differ:
        raise DataError(f"the data has {train.channels} channel(s) but the model takes "
                        f"{config.in_chans}: set model.in_chans={train.channels}"
                        + ("; the pretrained input convolution is then adapted to it, as "
                           "timm's adapt_input_conv does" if resize and config.in_chans == 3
                           else "") + _channels_last_hint(train))
    if size_differs:
        raise DataError(f"the images are {train.image_size[0]}x{train.image_size[1]} but the "
                        f"model takes {config.img_size[0]}x{config.img_size[1]}: set "
                        f"model.img_size={_size_value(train.image_size)}"
                        + _patch_size_fix(config, train.image_size) + "; or resize the data"
                        + _channels_last_hint(train))


def _patch_size_fix(config: ViTConfig, size: tuple[int, int]) -> str:
    """The patch size to set with `model.img_size=size` when the model's does not divide it."""
    if size[0] % config.patch_size == 0 == size[1] % config.patch_size:
        return ""
    words = patch_sizes_in_words(*size, config.stem_takes_patch)
    if words.startswith("none"):
        return (f" (no patch size above 1 that the model's stem takes divides "
                f"{size[0]}x{size[1]}: resize the images)")
    return f" and a patch size that divides it ({words}: {config.patch_size} does not)"


def _size_value(size: tuple[int, int]) -> str:
    """`size` as a KEY=VALUE value one shell word long: 8 for 8x8, 60x100 for 60x100."""
    return str(size[0]) if size[0] == size[1] else f"{size[0]}x{size[1]}"


def _channels_last_hint(train: Source) -> str:
    """For arrays read as (N, C, H, W) with a channel count pictures do not have: how to give
    channels-last arrays (read so only when the last axis is 1, 3 or 4)."""
    if not holds_float_images(train) or train.channels in (1, 3, 4):  # read as they are
        return ""
    return (f". The arrays were read as (N, C, H, W) with C={train.channels}; if they are "
            "(N, H, W, C), transpose them first: np.transpose(images, (0, 3, 1, 2)) (the last "
            "axis is read as channels only when it is 1, 3 or 4)")


def _set_in_model(cfg: TrainConfig, key: str) -> bool:
    """Whether the recipe's `model` dict sets `key` itself (else it follows the data)."""
    return isinstance(cfg.model, dict) and key in cfg.model


def channels_from_arrays(cfg: TrainConfig, config: ViTConfig, train: Source) -> ViTConfig:
    """data=arrays: a fresh model takes the arrays' channels (a model dict that sets
    `in_chans` to another number is refused, naming the data's)."""
    if cfg.data != "arrays" or cfg.init_from or train.channels == config.in_chans:
        return config
    if _set_in_model(cfg, "in_chans"):
        raise DataError(f"model.in_chans={config.in_chans} but the arrays in {cfg.data_dir} "
                        f"have {train.channels} channel(s): set model.in_chans="
                        f"{train.channels} (or leave it unset: data=arrays sizes it from the "
                        "data)" + _channels_last_hint(train))
    log.info("data=arrays: %d input channel(s)", train.channels)
    return config.replace(in_chans=train.channels)


def holds_float_images(train: Source) -> bool:
    """Whether `train` holds float arrays (data=arrays) rather than 8-bit pictures."""
    return bool(getattr(train, "float_images", False))


def augment_config(cfg: TrainConfig, streamed: bool, task: TaskSpec | None = None,
                   float_images: bool = False) -> AugmentConfig:
    """The batched augmentation; on streamed data the Inception crop replaces the padded
    random crop. Float arrays take flips (only when asked) and Mixup/CutMix: crop padding,
    TrivialAugment and random erasing are off, and refused by name when set. The task refuses
    what it cannot train with (`Task.check_augment`: label smoothing is for classification)
    and sets its own policy (`Task.adjust_augment`: regression leaves the flip and crop padding
    off unless they are set, since targets may be positions)."""
    policy = make_task(task)
    augment = AugmentConfig(**cfg.augment)
    if streamed and augment.crop_padding:
        if "crop_padding" in cfg.augment:
            log.info("streamed data: the Inception crop replaces augment.crop_padding")
        augment = replace(augment, crop_padding=0)
    policy.check_augment(augment)
    if float_images:
        refused = [f"augment.{key}={cfg.augment[key]}" for key in PICTURE_ONLY
                   if cfg.augment.get(key)]
        if refused:
            raise ConfigError(f"{', '.join(refused)}: data={cfg.data} holds float arrays "
                              "(measurements, not 8-bit pictures), which take no crop "
                              "padding, TrivialAugment colour ops or random erasing: drop "
                              f"{'it' if len(refused) == 1 else 'them'} (float arrays take "
                              "augment.flip=true and augment.mixup_alpha / cutmix_alpha)")
        augment = replace(augment, crop_padding=0, trivial_augment=False, random_erasing=0.0,
                          flip=bool(cfg.augment.get("flip", False)))
    augment = policy.adjust_augment(augment, cfg, streamed, float_images)
    if cfg.tta == "flip" and not augment.flip:
        log.warning("tta=flip averages each test input with its mirror image, but this run "
                    "does not flip its training inputs (augment.flip=false), so the mirror "
                    "images are new to the model and can cost accuracy: set tta=none, or "
                    "augment.flip=true")
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
