"""The images an analysis runs on: files through the model's preprocessing (image files, and
array files as `vitkit predict` reads them), or test images of a data source (by default the
one a training checkpoint was trained on), sampled across its classes (at random for
regression and multi-label targets) and read as `vitkit predict` would read their files.
Batches are uint8 pictures, or float arrays in their data's units (data=arrays)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from vitkit.data.array_inputs import image_file_refusal, is_array_file, read_array_images
from vitkit.data.dataset import ImageDataset
from vitkit.data.image_decoder import open_image
from vitkit.data.sources.records import ImageRecords
from vitkit.data.transforms import EvalResize, stack_images, to_model_size
from vitkit.errors import InputError
from vitkit.preprocess import Preprocess
from vitkit.tasks import Task, make_task

log = logging.getLogger(__name__)


def as_batch(images: torch.Tensor | Sequence[Image.Image], preprocess: Preprocess
             ) -> torch.Tensor:
    """(B, C, H, W) at the model's size from PIL images, a uint8 batch (resized as pictures
    if its size differs) or a float batch of arrays (resized bilinear, antialiased when
    shrinking)."""
    if isinstance(images, torch.Tensor):
        if images.dim() != 4 or not (images.dtype == torch.uint8 or images.is_floating_point()):
            raise InputError(f"images must be a uint8 or float (B, C, H, W) tensor or PIL "
                             f"images, got {images.dtype} {tuple(images.shape)}")
        if images.is_floating_point():
            if images.shape[1] != preprocess.channels:
                raise InputError(f"the images have {images.shape[1]} channel(s), the model "
                                 f"takes {preprocess.channels}")
            return to_model_size(images.float(), preprocess)
        if tuple(images.shape[-2:]) == tuple(preprocess.img_size) and \
                images.shape[1] == preprocess.channels:
            return images
        images = [_to_pil(image) for image in images]
    if len(images) == 0:
        raise InputError("no images to analyse: pass at least one")
    return torch.stack([to_model_size(image, preprocess) for image in images])


def _to_pil(image: torch.Tensor) -> Image.Image:
    array = image.permute(1, 2, 0).cpu().numpy()
    return Image.fromarray(array[:, :, 0] if array.shape[2] == 1 else array)


def images_from_files(paths: Sequence[str | Path], preprocess: Preprocess
                      ) -> tuple[torch.Tensor, list[str]]:
    """Read image files (`vitkit.data.image_decoder`) and array files (`vitkit.data.array_inputs`:
    one image per array image, named file.npy[i]) into a batch at the model's size: uint8
    when every input is a picture or a uint8 array, else float."""
    images: list[torch.Tensor] = []
    names: list[str] = []
    for path in paths:
        if is_array_file(path):
            arrays = read_array_images(path, preprocess.channels, preprocess.scale,
                                       img_size=preprocess.img_size)
            images += list(to_model_size(arrays.tensor(), preprocess))
            names += [arrays.name(i) for i in range(len(arrays))]
        else:
            refusal = image_file_refusal(path, preprocess.scale)
            if refusal:
                raise InputError(refusal)
            images.append(to_model_size(open_image(path, preprocess.channels), preprocess))
            names.append(str(path))
    if not images:
        raise InputError("no images to analyse: pass at least one")
    return stack_images(images), names


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
                     seed: int = 0, task: Task | None = None) -> tuple[torch.Tensor, list[str]]:
    """`count` test images of `data` (default: the checkpoint's training data), sampled
    across classes by `stratified_indices` (all of them when the test split is smaller); for
    regression and multi-label targets ((N, K) or float), a seeded random sample, each named
    with its targets (`task` names them).

    Folders and Hugging Face datasets are read from their files, each image through
    `preprocess` as `vitkit predict` and `vitkit eval` read it (`EvalResize`: the shorter
    side and a centre crop, or a squash, as the weights say); the small embedded sets (digits,
    CIFAR) and arrays as they are held, resized when their size differs."""
    from vitkit.data.sources import IN_MEMORY_ONLY, open_held_out_only, open_source

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
    mode = "memory" if data in IN_MEMORY_ONLY else "stream"
    kind = make_task(task).kind  # None: classification
    test = open_held_out_only(data, data_dir, preprocess.img_size, preprocess.channels,
                              mode=mode, task=kind)  # a folder of test images only
    if test is None:
        _, test = open_source(data, data_dir, preprocess.img_size, preprocess.channels,
                              train_limit=1, mode=mode,
                              eval_split=trained.get("split") if own else None, task=kind)
    labels = torch.as_tensor(np.asarray(test.labels))
    classes = labels.dim() == 1 and not labels.is_floating_point()
    if classes:
        chosen = stratified_indices(labels, count, seed).tolist()
    else:
        generator = torch.Generator().manual_seed(seed)
        chosen = torch.randperm(len(labels), generator=generator)[:count].tolist()
    if isinstance(test, ImageDataset):
        images = as_batch(test.images[chosen], preprocess)
    else:
        chosen, images = _read_through(test, chosen, preprocess)
    # a file's path where the data has files (folders, tables), so a title leads back to it
    where = test.where if not isinstance(test, ImageDataset) else lambda index: f"#{index}"
    names = [f"{data} test {where(index)}: "
             + (_class_text(int(labels[index]), list(test.classes)) if classes else
                _targets_text(labels[index], task, list(test.classes)))
             for index in chosen]
    return images, names


def _class_text(index: int, classes: list[str]) -> str:
    """A test image's class as its data names it; "class N" where the data names none
    (integer array labels)."""
    return classes[index] if 0 <= index < len(classes) else f"class {index}"


def _targets_text(row: torch.Tensor, task: Task | None, classes: list[str]) -> str:
    """A test image's targets in words (`Task.target_text`): "temperature=3.2" or the labels
    it has."""
    return make_task(task).target_text(row, classes)


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
