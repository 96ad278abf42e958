"""Class-per-folder image datasets (`root/<class_name>/<image>`), decoded by
`vitkit.data.images` (so every file is converted, or skipped with a named reason, as
`predict` and `explain` do it).

Files are decoded in worker processes and gathered into one uint8 (N, C, H, W) tensor.
Classes are the sub-folder names, sorted; label i names `classes[i]`. The files are listed by
`FolderRecords` (the one owner of the folder layout and its cached index); empty class folders
are warned about and left out.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vitkit.data.dataset import DataError, ImageDataset
from vitkit.data.images import decode_image
from vitkit.data.skipped import summarize_skips, write_skipped_files
from vitkit.data.sources.folder_index import IMAGE_EXTENSIONS, FolderRecords

__all__ = ["IMAGE_EXTENSIONS", "load_image_folder", "write_skipped_files"]

logger = logging.getLogger("vitkit.data")

# Below this many files (with `workers=None`) decoding in-process beats starting a pool.
_POOL_MIN_FILES = 64
_MAX_AUTO_WORKERS = 8

# What a worker sends back: ("ok", CHW uint8 array), ("bad", (kind, detail)) or
# ("size", (h, w)).
_Result = tuple[str, object]


def _size_hw(image_size: int | tuple[int, int] | None) -> tuple[int, int] | None:
    if image_size is None:
        return None
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    if len(size) != 2 or not all(isinstance(s, int) and s > 0 for s in size):
        raise DataError(f"image_size must be a positive int or (height, width), got "
                        f"{image_size!r}")
    return size[0], size[1]


def _fmt(hw: tuple[int, int]) -> str:
    return f"{hw[0]}x{hw[1]}"


def _decode(path: str, channels: int, size: tuple[int, int] | None, resize: bool,
            max_pixels: int | None) -> _Result:
    """Decode one file to a CHW uint8 array (worker-process entry point)."""
    Image.MAX_IMAGE_PIXELS = max_pixels  # the caller's limit, also in spawned workers
    decoded = decode_image(path, channels)
    if decoded.image is None:
        return "bad", (decoded.kind, decoded.detail)
    img = decoded.image
    if size is not None and (img.height, img.width) != size:
        if not resize:
            return "size", (img.height, img.width)
        img = img.resize((size[1], size[0]), Image.Resampling.BILINEAR)
    arr = np.asarray(img, dtype=np.uint8)
    arr = arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)
    return "ok", np.ascontiguousarray(arr)


def _worker_count(workers: int | None, n_files: int) -> int:
    if workers is not None:
        if workers < 0:
            raise DataError(f"workers must be >= 0 (0 decodes in-process), got {workers}")
        return min(workers, n_files)
    if n_files < _POOL_MIN_FILES:
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    count = min(cores or 1, _MAX_AUTO_WORKERS)
    return 0 if count <= 1 else count


def _results(fn: partial[_Result], paths: list[str], pool: ProcessPoolExecutor | None,
             workers: int) -> Iterator[_Result]:
    if pool is None:
        return map(fn, paths)
    chunksize = max(1, min(64, len(paths) // (workers * 4)))
    return pool.map(fn, paths, chunksize=chunksize)


def _named(skipped: list[tuple[str, str]], limit: int = 3) -> str:
    """"a.png (truncated: ...); b.jpg (empty file: 0 bytes); ..." for the first `limit`."""
    shown = "; ".join(f"{rel} ({reason})" for rel, reason in skipped[:limit])
    return shown + ("; ..." if len(skipped) > limit else "")


def load_image_folder(
    root: str | Path,
    image_size: int | tuple[int, int] | None = None,
    channels: int = 3,
    workers: int | None = None,
    resize: bool = True,
) -> ImageDataset:
    """Decode every image under `root/<class_name>/` into an in-memory `ImageDataset`.

    `image_size` (int or (height, width)): images of another size are resized (bilinear) when
    `resize`, else rejected. Without it all images must share one size. `channels`: 3 (RGB) or
    1 (grayscale). `workers`: decoding processes; None picks by CPU count (in-process for
    small folders), 0 decodes in-process. Files are decoded by `vitkit.data.images` (EXIF
    rotation, transparency on white, 16-bit scaled); unreadable ones are skipped: counted in
    `skipped`, every one named with its reason in `skipped_files`, summarised in `notes` and
    the log (`write_skipped_files` writes them to a run's folder).
    """
    if channels not in (1, 3):
        raise DataError(f"channels must be 1 (grayscale) or 3 (RGB), got {channels}")
    size = _size_hw(image_size)
    root = Path(root).expanduser()
    records = FolderRecords.scan(root)
    classes = records.classes
    files = [(Path(records.where(i)), int(label)) for i, label in enumerate(records.labels)]
    root = records.root
    paths = [str(p) for p, _ in files]
    n_workers = _worker_count(workers, len(paths))
    fn = partial(_decode, channels=channels, size=size, resize=resize,
                 max_pixels=Image.MAX_IMAGE_PIXELS)

    out: np.ndarray | None = None
    labels: list[int] = []
    skipped: list[tuple[str, str]] = []  # (path relative to root, "kind: detail")
    sizes: dict[tuple[int, int], list] = {}  # (h, w) -> [count, example file]
    pool = ProcessPoolExecutor(max_workers=n_workers) if n_workers > 0 else None
    try:
        results = _results(fn, paths, pool, n_workers)
        for (path, label), (status, value) in zip(files, results, strict=True):
            rel = path.relative_to(root).as_posix()
            if status == "bad":
                kind, detail = value
                skipped.append((rel, f"{kind}: {detail}"))
                logger.debug("%s: skipped %s (%s: %s)", root, rel, kind, detail)
                continue
            if status == "size":
                raise DataError(
                    f"{rel} is {_fmt(value)} (HxW) but image_size is {_fmt(size)}; pass "
                    f"resize=True to resize such images, or resize the files to {_fmt(size)} "
                    f"beforehand")
            arr: np.ndarray = value
            hw = (arr.shape[1], arr.shape[2])
            entry = sizes.setdefault(hw, [0, rel])
            entry[0] += 1
            if out is None:
                out = np.empty((len(files), *arr.shape), dtype=np.uint8)
            if len(sizes) > 1:
                continue  # mixed sizes: keep counting them for the error below
            out[len(labels)] = arr
            labels.append(label)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    if len(sizes) > 1:
        common = sorted(sizes.items(), key=lambda kv: -kv[1][0])
        listed = ", ".join(f"{_fmt(hw)} ({n} files, e.g. {ex})" for hw, (n, ex) in common[:3])
        raise DataError(f"images in {root} have {len(sizes)} different sizes (HxW): {listed}"
                        f"{', ...' if len(common) > 3 else ''}; pass image_size=(H, W) (or an "
                        f"int) to resize them all to one size")
    if out is None:
        raise DataError(f"no readable images in {root}: all {len(files)} files were skipped "
                        f"({_named(skipped)}); check the files are valid images")

    notes: list[str] = []
    if skipped:
        note = (f"{summarize_skips(skipped, len(files))}: {_named(skipped, 2)}; every one is "
                f"in the dataset's skipped_files (write_skipped_files saves them)")
        notes.append(note)
        logger.warning("%s: %s", root, note)
    kept = set(labels)
    lost = [name for i, name in enumerate(classes) if i not in kept]
    if lost:
        note = f"class(es) with no readable images: {', '.join(lost)}"
        notes.append(note)
        logger.warning("%s: %s", root, note)

    if len(labels) < len(out):
        out = out[:len(labels)].copy()  # release the rows reserved for skipped files
    return ImageDataset(
        images=torch.from_numpy(out),
        labels=torch.tensor(labels, dtype=torch.int64),
        classes=classes,
        name=root.name,
        skipped=len(skipped),
        notes=notes,
        skipped_files=[(str(root / rel), reason) for rel, reason in skipped],
    )
