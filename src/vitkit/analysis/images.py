"""The images an analysis runs on: files through the model's preprocessing, or test images
of a data source (by default the one a training checkpoint was trained on), sampled across
its classes and read as `vitkit predict` would read their files."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from vitkit.data.dataset import ImageDataset
from vitkit.data.images import open_image
from vitkit.data.sources.records import ImageRecords
from vitkit.data.transforms import EvalResize
from vitkit.errors import InputError
from vitkit.preprocess import Preprocess

log = logging.getLogger(__name__)


def as_uint8_batch(images: torch.Tensor | Sequence[Image.Image], preprocess: Preprocess
                   ) -> torch.Tensor:
    """uint8 (B, C, H, W) at the model's size from PIL images or a uint8 batch (resized if
    its size differs)."""
    if isinstance(images, torch.Tensor):
        if images.dtype != torch.uint8 or images.dim() != 4:
            raise InputError(f"images must be a uint8 (B, C, H, W) tensor or PIL images, got "
                             f"{images.dtype} {tuple(images.shape)}")
        if tuple(images.shape[-2:]) == tuple(preprocess.img_size) and \
                images.shape[1] == preprocess.channels:
            return images
        images = [_to_pil(image) for image in images]
    if len(images) == 0:
        raise InputError("no images to analyse: pass at least one")
    return torch.stack([preprocess.to_uint8(image) for image in images])


def _to_pil(image: torch.Tensor) -> Image.Image:
    array = image.permute(1, 2, 0).cpu().numpy()
    return Image.fromarray(array[:, :, 0] if array.shape[2] == 1 else array)


def images_from_files(paths: Sequence[str | Path], preprocess: Preprocess
                      ) -> tuple[torch.Tensor, list[str]]:
    """Read image files (`vitkit.data.images`) into a uint8 batch at the model's size; names =
    the paths."""
    pictures = [open_image(path, preprocess.channels) for path in paths]
    return as_uint8_batch(pictures, preprocess), [str(path) for path in paths]


def stratified_indices(labels: torch.Tensor, count: int, seed: int = 0) -> torch.Tensor:
    """`count` indices (all, if fewer) that take the classes in turn: a seeded shuffle of the
    classes, each class's images in a seeded random order, one image per class per round
    until a class runs out. The first min(count, classes) indices are of different
    classes, and every class gets count // classes or one more while it lasts."""
    generator = torch.Generator().manual_seed(seed)
    classes = labels.unique()
    classes = classes[torch.randperm(len(classes), generator=generator)]
    queues = [torch.nonzero(labels == c).flatten() for c in classes]
    queues = [q[torch.randperm(len(q), generator=generator)].tolist() for q in queues]
    chosen: list[int] = []
    for round_index in range(max(map(len, queues), default=0)):
        if len(chosen) >= count:
            break
        chosen += [q[round_index] for q in queues if round_index < len(q)]
    return torch.tensor(chosen[:count], dtype=torch.long)


def images_from_data(data: str | None, data_dir: str | None, count: int,
                     preprocess: Preprocess, train_config: dict[str, Any] | None = None,
                     seed: int = 0) -> tuple[torch.Tensor, list[str]]:
    """`count` test images of `data` (default: the checkpoint's training data), sampled
    across classes by `stratified_indices` (all of them when the test split is smaller).

    Folders and Hugging Face datasets are read from their files, each image through
    `preprocess` as `vitkit predict` and `vitkit eval` read it (`EvalResize`: the shorter
    side and a centre crop, or a squash, as the weights say); the small embedded sets (digits,
    CIFAR) as they are held, resized by `preprocess` when their size differs."""
    from vitkit.data.sources import IN_MEMORY_ONLY, open_source

    trained = train_config or {}
    data = data or trained.get("data")
    own = data is not None and data == trained.get("data")
    if data_dir is None and own:
        data_dir = trained.get("data_dir")
    if data is None:
        raise InputError("no images given and the weights do not say what data they were "
                         "trained on: pass image files (vitkit explain WEIGHTS a.png b.jpg) or "
                         "a data source (--data cifar10 --data-dir DIR)")
    if count < 1:
        raise InputError(f"--num-images must be at least 1, got {count}")
    _, test = open_source(data, data_dir, preprocess.img_size, preprocess.channels,
                          train_limit=1, mode="memory" if data in IN_MEMORY_ONLY else "stream",
                          eval_split=trained.get("split") if own else None)
    chosen = stratified_indices(torch.as_tensor(np.asarray(test.labels)), count, seed).tolist()
    if isinstance(test, ImageDataset):
        images = as_uint8_batch(test.images[chosen], preprocess)
    else:
        chosen, images = _read_through(test, chosen, preprocess)
    names = [f"{data} test #{index}: {test.classes[int(test.labels[index])]}"
             for index in chosen]
    return images, names


def _read_through(records: ImageRecords, chosen: list[int], preprocess: Preprocess
                  ) -> tuple[list[int], torch.Tensor]:
    """Records `chosen` decoded and put through the evaluation transform of `preprocess`;
    (the indices read, their uint8 batch). A record that cannot be decoded is left out with
    a warning, as evaluation leaves it out."""
    resize = EvalResize(preprocess)
    kept, images = [], []
    for index in chosen:
        decoded = records.read(index, preprocess.channels)
        if decoded.image is None:
            log.warning("%s: skipped %s (%s)", records.name, records.where(index),
                        decoded.reason)
            continue
        kept.append(index)
        images.append(torch.from_numpy(resize(decoded.image)))
    if not images:
        raise InputError(f"none of the {len(chosen)} sampled test images of {records.name} "
                         "could be decoded: pass image files instead")
    return kept, torch.stack(images)
