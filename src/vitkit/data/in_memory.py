"""The one decode-into-memory path: every image of an `ImageRecords` (a folder, a Hugging Face
split) decoded by `vitkit.data.image_decoder` and gathered into one uint8 (N, C, H, W)
`ImageDataset`.

Records are decoded in worker processes (each reads its share by index) and resized to one
size by `vitkit.data.transforms.squash`. Unreadable records are skipped: counted, named with
their reason in `skipped_files`, summarised in `notes` and the log; classes left with no
readable image are noted. Labels come from the records, so classes keep their numbering.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from functools import partial

import numpy as np
import torch
from PIL import Image

from vitkit.data.dataset import DataError, ImageDataset
from vitkit.data.skipped import summarize_skips
from vitkit.data.sources.records import ImageRecords
from vitkit.data.transforms import squash, to_chw
from vitkit.data.workers import auto_workers

__all__ = ["decode_into_memory", "size_hw"]

logger = logging.getLogger("vitkit.data")

# Below this many records (with `workers=None`) decoding in-process beats starting a pool.
_POOL_MIN_FILES = 64

# What a decode returns: ("ok", CHW uint8 array), ("bad", (kind, detail)) or ("size", (h, w)).
_Result = tuple[str, object]
_worker_records: ImageRecords | None = None  # the records a pool worker reads


def size_hw(image_size: int | tuple[int, int] | None) -> tuple[int, int] | None:
    """`image_size` (an int or (height, width)) as (height, width), checked; None stays."""
    if image_size is None:
        return None
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    if len(size) != 2 or not all(isinstance(s, int) and s > 0 for s in size):
        raise DataError(f"image_size must be a positive int or (height, width), got "
                        f"{image_size!r}")
    return size[0], size[1]


def _fmt(hw: tuple[int, int]) -> str:
    return f"{hw[0]}x{hw[1]}"


def _decode(records: ImageRecords, index: int, channels: int, size: tuple[int, int] | None,
            resize: bool) -> _Result:
    """Decode record `index` to a CHW uint8 array at `size` (when given)."""
    decoded = records.read(index, channels)
    if decoded.image is None:
        return "bad", (decoded.kind, decoded.detail)
    img = decoded.image
    if size is not None and (img.height, img.width) != size:
        if not resize:
            return "size", (img.height, img.width)
        img = squash(img, size)
    return "ok", to_chw(img)


def _start_worker(records: ImageRecords, max_pixels: int | None) -> None:
    global _worker_records
    _worker_records = records
    Image.MAX_IMAGE_PIXELS = max_pixels  # the caller's limit, also in spawned workers


def _decode_in_worker(index: int, channels: int, size: tuple[int, int] | None,
                      resize: bool) -> _Result:
    assert _worker_records is not None
    return _decode(_worker_records, index, channels, size, resize)


def _worker_count(workers: int | None, n_files: int) -> int:
    if workers is not None:
        if workers < 0:
            raise DataError(f"workers must be >= 0 (0 decodes in-process), got {workers}")
        return min(workers, n_files)
    if n_files < _POOL_MIN_FILES:
        return 0
    count = auto_workers()
    return 0 if count <= 1 else count


def _results(records: ImageRecords, channels: int, size: tuple[int, int] | None, resize: bool,
             pool: ProcessPoolExecutor | None, workers: int) -> Iterator[_Result]:
    indices = range(len(records))
    if pool is None:
        return map(partial(_decode, records, channels=channels, size=size, resize=resize),
                   indices)
    chunksize = max(1, min(64, len(records) // (workers * 4)))
    return pool.map(partial(_decode_in_worker, channels=channels, size=size, resize=resize),
                    indices, chunksize=chunksize)


def _named(skipped: list[tuple[str, str]], limit: int = 3) -> str:
    """"a.png (truncated: ...); b.jpg (empty file: 0 bytes); ..." for the first `limit`."""
    shown = "; ".join(f"{rel} ({reason})" for rel, reason in skipped[:limit])
    return shown + ("; ..." if len(skipped) > limit else "")


def _short_name(records: ImageRecords, index: int) -> str:
    """How notes and errors name record `index`: its path within the folder, else `where`."""
    relative = getattr(records, "relative_path", None)
    return relative(index) if relative is not None else records.where(index)


def decode_into_memory(records: ImageRecords, image_size: int | tuple[int, int] | None = None,
                       channels: int = 3, workers: int | None = None,
                       resize: bool = True) -> ImageDataset:
    """Decode every record into an in-memory `ImageDataset`.

    `image_size` (int or (height, width)): images of another size are resized (`squash`) when
    `resize`, else rejected. Without it all images must share one size. `channels`: 3 (RGB) or
    1 (grayscale). `workers`: decoding processes; None picks by CPU count (in-process for
    small sets), 0 decodes in-process. Images are decoded by `vitkit.data.image_decoder` (EXIF
    rotation, transparency on white, 16-bit scaled); unreadable ones are skipped: counted in
    `skipped`, every one named with its reason in `skipped_files`, summarised in `notes` and
    the log (`vitkit.data.skipped.write_skipped_files` writes them to a run's folder).
    """
    if channels not in (1, 3):
        raise DataError(f"channels must be 1 (grayscale) or 3 (RGB), got {channels}")
    size = size_hw(image_size)
    classes = list(records.classes)
    root = getattr(records, "root", records.name)  # how messages name the set
    labels_of = np.asarray(records.labels)  # int64 (N,) classes, or float32 (N, K) targets
    n_workers = _worker_count(workers, len(records))

    out: np.ndarray | None = None
    kept_rows: list[int] = []  # the indices of the records kept
    skipped: list[tuple[str, str]] = []  # (short name, "kind: detail")
    skipped_files: list[tuple[str, str]] = []  # (full name, "kind: detail")
    sizes: dict[tuple[int, int], list] = {}  # (h, w) -> [count, example file]
    pool = (ProcessPoolExecutor(max_workers=n_workers, initializer=_start_worker,
                                initargs=(records, Image.MAX_IMAGE_PIXELS))
            if n_workers > 0 else None)
    try:
        results = _results(records, channels, size, resize, pool, n_workers)
        for index, (status, value) in enumerate(results):
            rel = _short_name(records, index)
            if status == "bad":
                kind, detail = value
                skipped.append((rel, f"{kind}: {detail}"))
                skipped_files.append((records.where(index), f"{kind}: {detail}"))
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
                out = np.empty((len(records), *arr.shape), dtype=np.uint8)
            if len(sizes) > 1:
                continue  # mixed sizes: keep counting them for the error below
            out[len(kept_rows)] = arr
            kept_rows.append(index)
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
        raise DataError(f"no readable images in {root}: all {len(records)} files were skipped "
                        f"({_named(skipped)}); check the files are valid images")

    notes: list[str] = []
    if skipped:
        note = (f"{summarize_skips(skipped, len(records))}: {_named(skipped, 2)}; every one is "
                f"in the dataset's skipped_files (write_skipped_files saves them)")
        notes.append(note)
        logger.warning("%s: %s", root, note)
    kept_labels = labels_of[np.asarray(kept_rows, dtype=np.int64)]
    # classes whose every image was skipped (a table's class indices need not all occur)
    held = set(labels_of.tolist()) if labels_of.ndim == 1 else set(range(len(classes)))
    kept = set(kept_labels.tolist()) if kept_labels.ndim == 1 else held
    lost = [name for i, name in enumerate(classes) if i in held and i not in kept]
    if lost:
        note = f"class(es) with no readable images: {', '.join(lost)}"
        notes.append(note)
        logger.warning("%s: %s", root, note)

    if len(kept_rows) < len(out):
        out = out[:len(kept_rows)].copy()  # release the rows reserved for skipped files
    return ImageDataset(
        images=torch.from_numpy(out),
        labels=torch.from_numpy(kept_labels.astype(np.float32 if kept_labels.ndim == 2
                                                   else np.int64)),
        classes=classes,
        name=records.name,
        skipped=len(skipped),
        notes=notes,
        skipped_files=skipped_files,
    )
