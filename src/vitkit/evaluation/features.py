"""Frozen features: the representation a model gives each image of a data set's train and
test split, extracted once and cached for the few-shot, probe and kNN evaluations.

The representation is `forward_head(forward_features(x), pre_logits=True)`: the pre-logits
layer's output when the model has one (as big_vision's few-shot evaluator reads
`pre_logits`), else the pooled representation after the model's final norm. Features are
cached under $VITKIT_CACHE/features (default ~/.cache/vitkit/features) in a safetensors file
keyed by a hash of the weights' tensors and config, the data, its splits and limits, the image
size and the preprocessing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import save

from vitkit.catalog import read_weights
from vitkit.data.feeds import EvaluationFeed
from vitkit.data.transforms import resize_batch
from vitkit.errors import DataError
from vitkit.evaluation.splits import data_for, recorded_limit_key, split_to_evaluate
from vitkit.files import cache_root, write_atomic
from vitkit.model.vit import VisionTransformer
from vitkit.preprocess import Preprocess
from vitkit.tasks import Task, TaskSpec, make_task, task_of
from vitkit.weights import WeightsRecord, build_model
from vitkit.weights.checksum import tensors_checksum

log = logging.getLogger("vitkit.evaluation")

CACHE_VERSION = 2  # 2: a classifier's targets.csv of class indices gives class labels
SPLITS = ("train", "test")


@dataclass(frozen=True)
class FrozenFeatures:
    """Float32 features and targets of the train and test split: int64 (N,) class labels, or
    float32 (N, K) regression or multi-label targets (`task` says which)."""

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    classes: list[str]
    representation: str  # which output of the model the features are
    data: str
    weights_file: Path | None = None  # the file the weights were read from
    from_cache: bool = False
    task: TaskSpec | None = None  # the weights' task (None: classification)

    @property
    def kind(self) -> str:
        return self.task_object.kind

    @property
    def task_object(self) -> Task:
        """The weights' task (`vitkit.tasks`): what the reports say of the targets."""
        return make_task(self.task)

    @property
    def num_classes(self) -> int:
        """Classes; for regression and multi-label targets, outputs (targets per image)."""
        if self.train_y.ndim == 2:
            return self.train_y.shape[1]
        top = max(int(self.train_y.max()), int(self.test_y.max())) + 1
        return max(len(self.classes), top)


def representation_of(model: VisionTransformer) -> str:
    """Which output `forward_head(..., pre_logits=True)` returns, in words."""
    config = model.config
    if config.pre_logits_dim:
        return f"pre-logits (the tanh layer before the head, {config.pre_logits_dim} dims)"
    norm = {"tokens": "after the final norm", "pooled": "after the pooled norm",
            "none": "(the model has no final norm)"}.get(config.final_norm, "")
    return (f"pooled representation {norm} (pool={config.pool}, "
            f"{config.width} dims; the model has no pre-logits layer)")


@torch.no_grad()
def extract_features(model: VisionTransformer, dataset: EvaluationFeed,
                     preprocess: Preprocess, image_size: tuple[int, int] | None = None,
                     batch_size: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """(features (N, D) float32, labels) of every image, in the data set's order: int64 (N,)
    class labels, or float32 targets as the data set holds them (regression, multi-label).

    Images are normalised with `preprocess` and resized to `image_size` when theirs differs
    (bilinear, antialiased when shrinking), as `vitkit eval` and fine-tuning do.
    """
    was_training = model.training
    model.eval()
    batches = dataset.eval_batches(batch_size)
    features, labels = [], []
    for images, batch_labels in batches:
        x = resize_batch(preprocess.normalize(images), image_size)
        features.append(model.forward_head(model.forward_features(x), pre_logits=True).float())
        labels.append(batch_labels)
    model.train(was_training)
    if not features:
        return np.zeros((0, 0), np.float32), np.zeros(0, np.int64)
    targets = torch.cat(labels)
    targets = targets.float() if targets.is_floating_point() else targets.long()
    return torch.cat(features).numpy(), targets.numpy()


def features_cache_dir() -> Path:
    return cache_root() / "features"


def _cache_key(weights: WeightsRecord, model: VisionTransformer, sources: dict[str, tuple]
               ) -> str:
    recipe = weights.train_config or {}
    reading = {k: recipe.get(k) for k in ("data", "data_mode", "train_split", "split",
                                         "streaming")}
    key = {"version": CACHE_VERSION, "tensors": tensors_checksum(weights.state_dict),
           "config": model.config.to_dict(), "preprocess": weights.preprocess.to_dict(),
           "sources": {split: [str(Path(p).resolve()) if i == 1 and p else p
                               for i, p in enumerate(source)]
                       for split, source in sources.items()},
           "recipe_reading": reading,
           "data_stamps": {split: _data_stamp(source[1] or _local_dataset(source[0]))
                           for split, source in sources.items()}}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _local_dataset(data: str) -> str | None:
    """The folder of a Hugging Face dataset read from disk (hf:PATH: save_to_disk's or a
    folder of parquet files), whose files stamp it as a data folder's do; None otherwise."""
    path = data[len("hf:"):] if data.startswith("hf:") else ""
    return path if path and Path(path).expanduser().is_dir() else None


def _data_stamp(data_dir: str | None, depth: int = 2, most: int = 20_000) -> list | None:
    """Size and modification time of the data's files and folders down to `depth` levels
    (arrays and CIFAR files; an image folder's split and class folders, whose times change
    as images come and go), so features of data edited since are extracted again."""
    if not data_dir or not Path(data_dir).expanduser().exists():
        return None
    root = Path(data_dir).expanduser()
    paths = [root] + [p for level in range(1, depth + 1)
                      for p in sorted(root.glob("/".join(["*"] * level)))[:most]]
    stamps = []
    for path in paths:
        try:
            stat = path.stat()
        except OSError:
            continue
        stamps.append([path.relative_to(root).as_posix(), stat.st_size, stat.st_mtime_ns])
    return stamps


def _read_cache(path: Path, data: str, weights_file: Path | None) -> FrozenFeatures:
    with safe_open(str(path), framework="numpy") as file:
        meta = file.metadata()
        arrays = {name: file.get_tensor(name) for name in file.keys()}  # noqa: SIM118
    return FrozenFeatures(arrays["train_x"], arrays["train_y"], arrays["test_x"],
                          arrays["test_y"], json.loads(meta["classes"]), meta["representation"],
                          data, weights_file, from_cache=True)


def _write_cache(path: Path, features: FrozenFeatures) -> None:
    arrays = {"train_x": features.train_x, "train_y": features.train_y,
              "test_x": features.test_x, "test_y": features.test_y}
    meta = {"classes": json.dumps(features.classes), "representation": features.representation}
    data = save({k: np.ascontiguousarray(v) for k, v in arrays.items()}, metadata=meta)
    write_atomic(path, lambda stream: stream.write(data))


def _check_split(labels: np.ndarray, data: str, split: str) -> None:
    if len(labels) == 0:
        raise DataError(f"the {split} split of {data} has no images: check --data-dir (a "
                        f"folder needs train/ and val/ or test/ with one sub-folder per class) "
                        f"or choose another data set")
    if np.issubdtype(labels.dtype, np.integer) and labels.min() < 0:
        raise DataError(f"the {split} split of {data} is unlabelled ({int((labels < 0).sum())} "
                        "images without a label): evaluate on a labelled split")


def _check_finite(features: np.ndarray, weights: str | Path, data: str, split: str) -> None:
    """Refuse features with inf or NaN (weights that overflow on these images), which would
    make the few-shot solve fail deep in numpy and the probe score every image as one class."""
    bad = ~np.isfinite(features).all(axis=1)
    if bad.any():
        raise DataError(f"{weights} gives features that are not finite (inf or NaN) for "
                        f"{int(bad.sum())} of the {len(features)} {split} images of {data}: "
                        "its outputs overflow float32 there. Check the weights (vitkit eval "
                        "reports the same images) and that the images are in the units the "
                        "weights were trained on")


def frozen_features(weights_source: str | Path, data: str | None = None,
                    data_dir: str | None = None, weights_dir: str | Path | None = None,
                    batch_size: int = 256, use_cache: bool = True,
                    check_task: Callable[[str], None] | None = None) -> FrozenFeatures:
    """The train and test features of `data` under the weights (any format `load_pretrained`
    reads), from the cache when they were extracted before. The data defaults to a training
    checkpoint's own, as for `vitkit eval`. `check_task` is given the weights' task kind
    before any image is read (a protocol for one kind refuses the others there)."""
    weights = read_weights(weights_source, weights_dir)
    model = build_model(weights)
    config = model.config
    if check_task is not None:
        check_task(task_of(model).kind)
    data_dir = data_for(weights, data, data_dir, SPLITS[0], None)[1]  # looked up (and said) once
    sources = {split: data_for(weights, data, data_dir, split, None) for split in SPLITS}
    for split, (named, _, limit) in sources.items():
        if limit is not None:
            log.info("%s: the first %d images, as the training run read them (its %s); name "
                     "the data (--data %s) to read every image", split, limit,
                     recorded_limit_key(split), named)
    name = sources["train"][0]
    path = features_cache_dir() / f"{_cache_key(weights, model, sources)}.safetensors"
    task = getattr(model, "task", None)
    if use_cache and path.exists():
        log.info("features of %s read from the cache %s", name, path)
        return dataclasses.replace(_read_cache(path, name, weights.path), task=task)
    arrays, classes = {}, []
    for split, (split_data, split_dir, limit) in sources.items():
        dataset, _ = split_to_evaluate(
            weights, split_data, split_dir, split, limit, config.img_size, config.in_chans,
            check_first=lambda feed, data=split_data: make_task(task).check_feature_data(
                feed, data))
        if tuple(dataset.image_size) != tuple(config.img_size):
            log.info("the %s images are %dx%d and the model takes %dx%d: resizing them "
                     "(bilinear, antialiased when shrinking), as fine-tuning does", split_data,
                     *dataset.image_size, *config.img_size)
        x, y = extract_features(model, dataset, weights.preprocess, config.img_size, batch_size)
        _check_split(y, split_data, split)
        _check_finite(x, weights_source, split_data, split)
        arrays[split] = (x, y)
        classes = classes or list(dataset.classes)
    features = FrozenFeatures(*arrays["train"], *arrays["test"], classes,
                              representation_of(model), name, weights.path,
                              task=task)
    log.info("extracted %d train and %d test features (%s)", len(features.train_y),
             len(features.test_y), features.representation)
    if use_cache:
        _write_cache(path, features)
    return features
