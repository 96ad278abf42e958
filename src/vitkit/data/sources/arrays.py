"""`data=arrays`: scientific arrays (fields, spectrograms, measurements) rather than 8-bit
pictures, from `.npz` files or folders of `.npy` files.

Each split is `DIR/<split>.npz` with the keys `images` and `targets` (and optionally
`target_names`, a 1-D array of strings), or a folder `DIR/<split>/` holding `images.npy`,
`targets.npy` (and optionally `target_names.npy`); the splits are `train` and `test` (else
`val`). Images are (N, H, W), (N, C, H, W), or channels-last (N, H, W, C) when that is
unambiguous (the last dimension is 1, 3 or 4 and the second is not); any integer, float or
bool dtype, always delivered as float32 in the data's own units (never assumed 0-255; the run
normalises with the training set's per-channel mean and std, `channel_stats`). Targets: (N,)
integers are classes; (N,) or (N, K) floats regression targets; (N, K) 0/1 multi-label targets
with task=multilabel.

Small sets are read into memory (`ImageDataset`); large ones (data_mode=stream, or auto above
the memory limit) stay in their files and are read batch by batch (`MappedArrays`), so memory
stays flat in the number of samples. That needs the array stored uncompressed: a `.npy` file
or a `numpy.savez` member. A `numpy.savez_compressed` member is read into memory instead (and
refused above the memory limit unless data_mode=memory).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vitkit.data.dataset import ImageDataset
from vitkit.data.sources.mapped import (
    MappedArrays,
    as_nchw,
    beyond_float32,
    first_unfit,
    geometry,
)
from vitkit.data.sources.npy_rows import check_dtype, npz_members, open_array
from vitkit.errors import DataError, first_few, unclear_names
from vitkit.files import relative_data_dir_note

__all__ = ["ARRAY_KEYS", "NAMES_KEY", "open_arrays"]

log = logging.getLogger("vitkit.data")

ARRAY_KEYS = ("images", "targets")
NAMES_KEY = "target_names"
HELD_OUT = ("test", "val")
_SAVE = "numpy.savez(path, images=..., targets=...)"
_LAYOUTS = ("{d}/{s}.npz (keys images, targets) or {d}/{s}/images.npy with "
            "{d}/{s}/targets.npy")


@dataclass(frozen=True)
class _Split:
    """Where one split's arrays lie: (file, npz member or None) for each."""

    where: str
    images: tuple[Path, str | None]
    targets: tuple[Path, str | None]
    names: tuple[Path, str | None] | None


def _locate(folder: Path, splits: tuple[str, ...]) -> _Split:
    for split in splits:
        npz = folder / f"{split}.npz"
        if npz.is_file():
            members = npz_members(npz)
            missing = [k for k in ARRAY_KEYS if k not in members]
            if missing:
                raise DataError(f"{npz} has no {' or '.join(missing)} (it holds "
                                f"{', '.join(members) or 'nothing'}): save the arrays as "
                                f"{_SAVE}")
            names = (npz, NAMES_KEY) if NAMES_KEY in members else None
            return _Split(str(npz), (npz, "images"), (npz, "targets"), names)
        sub = folder / split
        if sub.is_dir():
            files = {k: sub / f"{k}.npy" for k in (*ARRAY_KEYS, NAMES_KEY)}
            missing = [str(files[k]) for k in ARRAY_KEYS if not files[k].is_file()]
            if missing:
                raise DataError(f"{sub} has no {' or '.join(missing)}: a split folder holds "
                                "images.npy and targets.npy (numpy.save), or use "
                                f"{folder / split}.npz")
            names = (files[NAMES_KEY], None) if files[NAMES_KEY].is_file() else None
            return _Split(f"{sub}/", (files["images"], None), (files["targets"], None), names)
    wanted = " or ".join(_LAYOUTS.format(d=folder, s=s) for s in splits)
    raise DataError(f"data=arrays: found no {wanted}; write it with {_SAVE} (or numpy.save "
                    "of images.npy and targets.npy into a split folder)")


def _load_small(path: Path, member: str | None, where: str) -> np.ndarray:
    """A whole array (targets, names), never unpickled."""
    try:
        if member is None:
            return np.load(path, allow_pickle=False)
        with np.load(path, allow_pickle=False) as archive:
            return archive[member]
    except ValueError as err:
        if "pickle" in str(err):
            raise DataError(f"{where} holds Python objects (a pickled object array), which "
                            "vitkit does not load (unpickling can run code): save plain "
                            "numbers or strings, e.g. numpy.asarray(x, dtype=numpy.float32)"
                            ) from err
        raise DataError(f"{where} cannot be read ({err}): write it with numpy.save / "
                        "numpy.savez") from err


def _targets(split: _Split, count: int) -> tuple[torch.Tensor, list[str]]:
    where = f"{split.where} targets"
    targets = _load_small(*split.targets, where)
    check_dtype(targets.dtype, where)
    if targets.ndim not in (1, 2):
        raise DataError(f"{where} must be (N,) or (N, K), got shape {targets.shape}")
    if len(targets) != count:
        raise DataError(f"{split.where}: {count} images but {len(targets)} targets; give "
                        "every image one target (row i of targets belongs to image i)")
    if np.issubdtype(targets.dtype, np.floating):
        bad = np.flatnonzero(~np.isfinite(targets.reshape(len(targets), -1)).all(axis=1))
        if len(bad):
            raise DataError(f"{where}: {len(bad)} target(s) are NaN or inf, at index "
                            f"{first_few(bad)}; "
                            "drop or fix them")
        bad = np.flatnonzero(beyond_float32(targets))
        if len(bad):
            raise DataError(f"{where}: {len(bad)} target(s) are beyond float32's range (|x| > "
                            f"3.4e38), at index {first_few(bad)}; rescale them (other units, "
                            "or a log)")
    integral = targets.ndim == 1 and (np.issubdtype(targets.dtype, np.integer)
                                      or targets.dtype == np.bool_)
    tensor = torch.from_numpy(targets.astype(np.int64 if integral else np.float32))
    if not integral:
        tensor = tensor.reshape(len(tensor), -1)  # float targets are (N, K), K = 1 for (N,)
    names = _names(split, tensor) if split.names else []
    return tensor, names


def _names(split: _Split, targets: torch.Tensor) -> list[str]:
    where = f"{split.where} {NAMES_KEY}"
    names = _load_small(*split.names, where)
    if names.ndim != 1 or names.dtype.kind not in "US":
        raise DataError(f"{where} must be a 1-D array of strings, got {names.dtype} "
                        f"{names.shape}: save numpy.array(['name', ...])")
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in names.tolist()]
    problem = unclear_names(names)
    if problem:
        raise DataError(f"{where}: {problem}; give each target or class a name of its own "
                        "(reports list their figures by name)")
    if targets.is_floating_point():
        wanted = targets.shape[1]
        if len(names) != wanted:
            raise DataError(f"{where} names {len(names)} targets but each image has {wanted}: "
                            f"give one name per target column")
    elif len(targets) and len(names) <= int(targets.max()):
        raise DataError(f"{where} names {len(names)} classes but the targets run up to "
                        f"{int(targets.max())}: give one name per class")
    return names


def _image_layout(shape: tuple[int, ...], where: str) -> bool:
    """Whether (N, H, W, C) is meant (channels last); refuses other ranks."""
    if len(shape) == 3:
        return False
    if len(shape) != 4:
        raise DataError(f"{where} images must be (N, H, W), (N, C, H, W) or (N, H, W, C), got "
                        f"shape {shape}: reshape them (a single image is (1, H, W))")
    return shape[3] in (1, 3, 4) and shape[1] not in (1, 3, 4)


class _Opened:
    """One split, located and checked, not yet read: mapped or loaded on request."""

    def __init__(self, split: _Split, name: str, limit: int | None) -> None:
        self.split, self.name = split, name
        where = f"{split.where} images"
        self.shape, self.dtype, self.reader = open_array(*split.images)
        check_dtype(self.dtype, where)
        self.channels_last = _image_layout(self.shape, split.where)
        if self.shape[0] == 0:
            raise DataError(f"{split.where} holds no images")
        self.labels, self.classes = _targets(split, self.shape[0])
        self.count = min(limit, self.shape[0]) if limit else self.shape[0]
        self.channels, self.image_size = geometry(self.shape, self.channels_last)

    @property
    def float_bytes(self) -> int:
        return self.count * self.channels * self.image_size[0] * self.image_size[1] * 4

    def mapped(self) -> MappedArrays:
        assert self.reader is not None
        records = MappedArrays(self.reader, self.labels, self.classes, self.name,
                               self.channels_last, self.count, str(self.dtype))
        records.check_finite()
        return records

    def loaded(self) -> ImageDataset:
        if self.reader is not None:
            return MappedArrays(self.reader, self.labels, self.classes, self.name,
                                self.channels_last, self.count, str(self.dtype)).load()
        raw = _load_small(*self.split.images, f"{self.split.where} images")[:self.count]
        unfit = first_unfit(raw)
        if unfit is not None:
            raise DataError(f"{self.name}: image {unfit[0]} {unfit[1]}")
        return ImageDataset(torch.from_numpy(as_nchw(raw, self.channels_last)),
                            self.labels[:self.count], self.classes, self.name,
                            stored_dtype=str(self.dtype))


def _check_held_out(train: _Opened, test: _Opened) -> None:
    a, b = train, test
    if (a.channels, a.image_size) != (b.channels, b.image_size):
        raise DataError(f"{test.split.where} images are {b.channels}x{b.image_size[0]}x"
                        f"{b.image_size[1]} (CxHxW) but {train.split.where} images are "
                        f"{a.channels}x{a.image_size[0]}x{a.image_size[1]}: both splits need "
                        "one shape and channel count")
    if a.labels.shape[1:] != b.labels.shape[1:] or a.labels.dtype != b.labels.dtype:
        raise DataError(f"{test.split.where} targets are {b.labels.dtype} "
                        f"{tuple(b.labels.shape[1:])} per image but {train.split.where} "
                        f"targets are {a.labels.dtype} {tuple(a.labels.shape[1:])}: give both "
                        "splits targets of one kind")
    if test.classes and train.classes and test.classes != train.classes:
        raise DataError(f"{test.split.where} names its targets {test.classes[:5]} but "
                        f"{train.split.where} names them {train.classes[:5]}: use one naming")
    test.classes = train.classes


def _read(opened: _Opened, mapped: bool, memory_limit: int) -> ImageDataset | MappedArrays:
    if not mapped:
        return opened.loaded()
    if opened.reader is not None:
        return opened.mapped()
    if opened.float_bytes > memory_limit:
        raise DataError(f"{opened.split.where} images are stored compressed (or in Fortran "
                        f"order), so they cannot be read batch by batch, and take "
                        f"{opened.float_bytes / 1024**3:.1f} GiB as float32: save them with "
                        "numpy.savez (not savez_compressed) or numpy.save, or pass "
                        "data_mode=memory to read them into memory anyway")
    log.info("%s: the images are stored compressed, so they are read into memory "
             "(numpy.savez or numpy.save lets them be read batch by batch)", opened.split.where)
    return opened.loaded()


def _arrays_folder_above(file: Path) -> Path:
    """The folder above an arrays file that holds a training split (train.npz or train/):
    its own folder for data/train.npz, the one above for data/train/images.npy."""
    for folder in (file.parent, file.parent.parent):
        if (folder / "train.npz").is_file() or (folder / "train").is_dir():
            return folder
    return file.parent


def open_arrays(data_dir: str | None, train_limit: int | None = None,
                test_limit: int | None = None, mode: str = "memory",
                memory_limit: int = 2 * 1024**3
                ) -> tuple[ImageDataset | MappedArrays, ImageDataset | MappedArrays]:
    """The training and held-out arrays of `data_dir`, cut to their first `*_limit` records:
    in memory (`mode` "memory", or "auto" while their float32 images fit `memory_limit`) or
    read from the files batch by batch ("stream", or "auto" above the limit)."""
    train, test = _open_splits(data_dir, train_limit, test_limit)
    mapped = _mapped(train, test, mode, memory_limit)
    return _read(train, mapped, memory_limit), _read(test, mapped, memory_limit)


def open_arrays_held_out(data_dir: str | None, limit: int | None = None, mode: str = "memory",
                         memory_limit: int = 2 * 1024**3) -> ImageDataset | MappedArrays:
    """The held-out arrays alone, read as `open_arrays` reads them: the training split is
    located and checked against it (shape, targets, names) but its images are not read, so
    evaluation is not refused over them (a NaN image there, say)."""
    train, test = _open_splits(data_dir, None, limit)
    return _read(test, _mapped(train, test, mode, memory_limit, held_out_only=True),
                 memory_limit)


def _open_splits(data_dir: str | None, train_limit: int | None, test_limit: int | None
                 ) -> tuple[_Opened, _Opened]:
    """The training and held-out splits of `data_dir`, located and checked, not yet read."""
    if not data_dir:
        raise DataError("data=arrays needs data_dir=DIR holding train.npz and test.npz (or "
                        "train/ and test/ folders of images.npy and targets.npy)")
    folder = Path(data_dir).expanduser()
    if folder.is_file():
        raise DataError(f"data=arrays: data_dir={data_dir} is a file; data_dir is the folder "
                        f"that holds train.npz and test.npz (or train/ and test/ folders of "
                        f"images.npy and targets.npy): data_dir={_arrays_folder_above(folder)}")
    if not folder.is_dir():
        note = relative_data_dir_note(folder, fix=False)
        raise DataError(f"data=arrays: the folder {folder} does not exist{note}; pass the "
                        "folder holding train.npz and test.npz (or train/ and test/ folders of "
                        "images.npy and targets.npy): data_dir=DIR (--data-dir DIR)"
                        + (", by its full path or from the folder it is relative to"
                           if note else ""))
    train = _Opened(_locate(folder, ("train",)), "arrays:train", train_limit)
    split = _locate(folder, HELD_OUT)
    test = _Opened(split, f"arrays:{Path(split.where.rstrip('/')).stem}", test_limit)
    _check_held_out(train, test)
    return train, test


def _mapped(train: _Opened, test: _Opened, mode: str, memory_limit: int,
            held_out_only: bool = False) -> bool:
    """Whether the splits are read batch by batch (`mode` "stream", or "auto" above
    `memory_limit` for both splits' float32 images together, as training reads them)."""
    total = train.float_bytes + test.float_bytes
    mapped = mode == "stream" or (mode == "auto" and total > memory_limit)
    reading = (test,) if held_out_only else (train, test)
    streamed = [opened.split.where for opened in reading if opened.reader is not None]
    if mapped and streamed:  # compressed members say on their own that they are read whole
        log.info("data=arrays: images of %s read batch by batch (%.0f MB as float32 in all)",
                 " and ".join(streamed), total / 1024**2)
    return mapped
