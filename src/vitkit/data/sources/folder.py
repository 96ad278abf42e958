"""`data=folder`: class-per-folder images (`root/<class_name>/**/<image>`) read lazily from a
file index, with `root/train` and `root/val` (or `test/`) as the splits.

The folder is scanned once and the index cached (`<cache root>/index`, see `vitkit.files`):
a later start re-reads the index after checking the modification times of the folders it
covers, so millions of files are not listed again on every start (adding or removing a file
changes its folder's time and triggers a rescan). Paths are kept as one byte buffer with
offsets, so the index costs a few bytes per file and worker processes share it.
Empty class folders are warned about and left out. `load_image_folder` decodes one folder into
memory (`vitkit.data.in_memory`). A split folder holding `targets.csv` takes its targets from the
table instead of class sub-folders (`vitkit.data.sources.table`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from contextlib import suppress
from pathlib import Path

import numpy as np

from vitkit.data.dataset import ImageDataset
from vitkit.data.image_decoder import DecodedImage, decode_image
from vitkit.data.in_memory import decode_into_memory, size_hw
from vitkit.data.sources.table import (
    TABLE_NAME,
    TableRecords,
    as_class_labels,
    check_same_columns,
    held_out_class_labels,
)
from vitkit.errors import DataError, first_few
from vitkit.files import cache_root, relative_data_dir_note, write_atomic
from vitkit.tasks import make_task

__all__ = ["IMAGE_EXTENSIONS", "FolderRecords", "check_same_classes", "folder_splits",
           "is_image_folder", "load_image_folder", "open_folder", "open_held_out_folder"]

logger = logging.getLogger("vitkit.data")

IMAGE_EXTENSIONS = frozenset({
    ".bmp", ".gif", ".jpeg", ".jpg", ".pbm", ".pgm", ".png", ".ppm", ".tif", ".tiff", ".webp",
})
INDEX_VERSION = 1


def _scan_class(class_dir: str, files: list[str], dirs: list[str]) -> None:
    """Append every image under `class_dir` (paths relative to its parent), sorted, skipping
    hidden files and folders; `dirs` collects the folders visited (their times key the cache)."""
    stack = [class_dir]
    found: list[str] = []
    while stack:
        folder = stack.pop()
        dirs.append(folder)
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                if entry.is_dir():
                    stack.append(entry.path)
                elif os.path.splitext(entry.name)[1].lower() in IMAGE_EXTENSIONS:
                    found.append(entry.path)
    files.extend(sorted(found))


CLASS_LAYOUT = "one sub-folder per class ({root}/<class_name>/<image>.jpg)"
# What data=folder reads (`folder_splits`): the two splits, each a class-per-folder layout.
SPLITS_LAYOUT = ("{root}/train/<class_name>/<image>.jpg and {root}/val/<class_name>/<image>.jpg "
                 "(or test/ for val/), one sub-folder per class in each")


def _check_root(root: Path, layout: str = CLASS_LAYOUT) -> None:
    """Refuse a root that is missing or a file, describing the `layout` expected in it."""
    if not root.exists():
        raise DataError(f"image folder {root} does not exist{relative_data_dir_note(root)}; it "
                        f"should hold {layout.format(root=root)}")
    if not root.is_dir():
        raise DataError(f"{root} is a file, not a folder; pass a folder that holds "
                        f"{layout.format(root=root)}")


class FolderRecords:
    """`ImageRecords` over `root/<class_name>/...`: classes sorted by folder name, label i names
    `classes[i]`, files sorted within a class."""

    streamed = True  # decoded from the files as read

    def __init__(self, root: str | Path, classes: list[str], labels: np.ndarray,
                 blob: np.ndarray, offsets: np.ndarray) -> None:
        self.root = Path(root)
        self.name = self.root.name
        self.classes = classes
        self._labels = labels
        self._blob = blob  # every relative path, utf-8, back to back
        self._offsets = offsets  # path i is blob[offsets[i]:offsets[i + 1]]

    @classmethod
    def scan(cls, root: str | Path, use_cache: bool = True) -> FolderRecords:
        """The index of `root`: from the cache when its folders are unchanged, else scanned."""
        root = Path(root).expanduser().resolve()
        _check_root(root)
        cache = cache_root() / "index" / (hashlib.sha1(str(root).encode()).hexdigest()[:20]
                                           + ".npz")
        if use_cache:
            cached = cls._from_cache(root, cache)
            if cached is not None:
                return cached
        records, dirs = cls._scan(root)
        if use_cache:
            records._save_cache(cache, dirs)
        return records

    @classmethod
    def _scan(cls, root: Path) -> tuple[FolderRecords, list[str]]:
        class_dirs = sorted(p.name for p in os.scandir(root)
                            if p.is_dir() and not p.name.startswith("."))
        if not class_dirs:
            loose = sum(1 for p in root.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS)
            hint = (f" ({loose} images lie directly in it: move them into one sub-folder per "
                    "class)" if loose else "")
            raise DataError(f"{root} has no class folders{hint}; expected "
                            f"{root}/<class_name>/<image>.jpg, one sub-folder per class")
        dirs: list[str] = [str(root)]
        paths: list[str] = []
        labels: list[int] = []
        classes: list[str] = []
        empty: list[str] = []
        for name in class_dirs:
            before = len(paths)
            _scan_class(str(root / name), paths, dirs)
            if len(paths) == before:
                empty.append(name)
                continue
            labels.extend([len(classes)] * (len(paths) - before))
            classes.append(name)
        if empty:
            logger.warning("%s: class folder(s) with no images, left out: %s", root,
                           ", ".join(empty[:10]) + (" ..." if len(empty) > 10 else ""))
        if not classes:
            raise DataError(f"no images in any class folder of {root}; add images "
                            f"({', '.join(sorted(IMAGE_EXTENSIONS))}) to "
                            f"{root}/<class_name>/")
        start = len(str(root)) + 1
        encoded = [p[start:].encode() for p in paths]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
        blob = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        return cls(root, classes, np.asarray(labels, dtype=np.int64), blob, offsets), dirs

    @classmethod
    def _from_cache(cls, root: Path, cache: Path) -> FolderRecords | None:
        try:
            with np.load(cache, allow_pickle=False) as saved:
                meta = json.loads(bytes(saved["meta"]).decode())
                if meta.get("version") != INDEX_VERSION or meta.get("root") != str(root):
                    return None
                times = saved["times"]
                dirs = meta["dirs"]
                if len(dirs) != len(times):
                    return None
                for folder, stamp in zip(dirs, times.tolist(), strict=True):
                    if os.stat(folder).st_mtime_ns != stamp:
                        return None
                records = cls(root, meta["classes"], saved["labels"], saved["blob"],
                              saved["offsets"])
        except (OSError, ValueError, KeyError):
            return None  # missing, stale or damaged: scan again
        logger.info("%s: %d files in %d classes (cached index)", root, len(records),
                    len(records.classes))
        return records

    def _save_cache(self, cache: Path, dirs: list[str]) -> None:
        try:
            times = np.array([os.stat(d).st_mtime_ns for d in dirs], dtype=np.int64)
            meta = {"version": INDEX_VERSION, "root": str(self.root), "classes": self.classes,
                    "dirs": dirs}
            write_atomic(cache, lambda stream: np.savez(
                stream, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8), times=times,
                labels=self._labels, blob=self._blob, offsets=self._offsets))
        except OSError as err:  # a read-only home: the index still works, uncached
            logger.info("could not cache the file index of %s (%s)", self.root, err)

    # -- ImageRecords --------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._labels)

    @property
    def labels(self) -> np.ndarray:
        return self._labels

    def relative_path(self, index: int) -> str:
        start, end = self._offsets[index], self._offsets[index + 1]
        return self._blob[start:end].tobytes().decode()

    def where(self, index: int) -> str:
        return str(self.root / self.relative_path(index))

    def read(self, index: int, channels: int) -> DecodedImage:
        return decode_image(self.where(index), channels)

    def subset(self, count: int) -> FolderRecords:
        """The first `count` records (by class, then file name), same classes."""
        count = min(count, len(self))
        return FolderRecords(self.root, self.classes, self._labels[:count],
                             self._blob[:self._offsets[count]], self._offsets[:count + 1])


def folder_splits(root: str | Path) -> tuple[Path, Path]:
    """(train folder, held-out folder) of a data folder: root/train and root/val (or test)."""
    root = Path(root).expanduser()
    _check_root(root, SPLITS_LAYOUT)
    train = root / "train"
    held_out = next((root / sub for sub in ("val", "validation", "test")
                     if (root / sub).is_dir()), None)
    if not train.is_dir() or held_out is None:
        classes = _class_folders(root)
        if classes:
            raise DataError(_class_level_message(root, classes))
        found = sorted(p.name for p in root.iterdir() if p.is_dir())
        missing = "train/" if not train.is_dir() else "val/ (or test/)"
        raise DataError(f"{root} has no {missing} folder (it holds: "
                        f"{', '.join(found) or 'no folders'}); data=folder needs "
                        f"{SPLITS_LAYOUT.format(root=root)}")
    return train, held_out


def _class_folders(root: Path) -> list[str]:
    """The sub-folders of `root` with images directly in them (sorted): class folders."""
    def holds_images(folder: str) -> bool:
        with os.scandir(folder) as entries:
            return any(entry.is_file() and os.path.splitext(entry.name)[1].lower()
                       in IMAGE_EXTENSIONS for entry in entries)

    return sorted(entry.name for entry in os.scandir(root) if entry.is_dir()
                  and not entry.name.startswith(".") and holds_images(entry.path))


def _class_level_message(root: Path, classes: list[str]) -> str:
    """What to pass when `root` is itself one class-per-folder split, not the folder above the
    splits: its parent when that holds train/ and val/ (the user passed ROOT/train), else how
    to lay the classes out in train/ and val/."""
    parent = root.resolve().parent
    held_out = next((sub for sub in ("val", "validation", "test")
                     if (parent / sub).is_dir()), None)
    holds = f"{root} holds class folders ({first_few(classes)}) itself"
    if (parent / "train").is_dir() and held_out is not None:
        return (f"{holds}: it is one split of {parent}, which holds train/ and {held_out}/. "
                f"data=folder takes the folder above the splits: pass data_dir={parent} "
                f"(--data-dir {parent}), not {root.name}/")
    return (f"{holds}, not train/ and val/ folders: data=folder needs "
            f"{SPLITS_LAYOUT.format(root=root)}. Move the class folders into {root}/train/ and "
            f"put held-out images of each class in {root}/val/<class_name>/")


def is_image_folder(root: str | Path) -> bool:
    """Whether `root` holds an image folder: train/ and val/ (or test/) folders, or class
    sub-folders with images in them."""
    root = Path(root).expanduser()
    if not root.is_dir():
        return False
    if (root / "train").is_dir():
        return True
    return any(sub.is_dir() and not sub.name.startswith(".") and
               any(p.suffix.lower() in IMAGE_EXTENSIONS for p in sub.iterdir())
               for sub in root.iterdir())


def check_same_classes(train: list[str], held_out: list[str], train_dir: Path,
                       held_out_dir: Path) -> None:
    """Refuse splits whose class folders differ, naming the classes only one of them has."""
    if train == held_out:
        return
    only_train = sorted(set(train) - set(held_out))
    only_held = sorted(set(held_out) - set(train))

    def shown(names: list[str]) -> str:
        return first_few(names) if names else "none"

    raise DataError(f"the class folders of {train_dir} and {held_out_dir} differ: only in "
                    f"{train_dir.name}/: {shown(only_train)}; only in {held_out_dir.name}/: "
                    f"{shown(only_held)}. Both splits need the same class sub-folders (with "
                    "images in each)")


def warn_of_unlisted_images(table: TableRecords) -> None:
    """Warn of images beside a `targets.csv`, or in the sub-folders its rows name, that it has
    no row for: only the table's rows are read, so they would be left out without a word.
    Other sub-folders, and folders outside the table's (`../images`, which another split may
    share), are not looked into (a large data set may hold millions of files)."""
    listed = {os.path.normpath(path) for path in table.paths}
    folders = sorted({folder for folder in (os.path.dirname(path) for path in listed)
                      if _inside(folder)} | {""})
    unlisted: list[str] = []
    for folder in folders:
        with suppress(OSError), os.scandir(os.path.join(table.root, folder)) as entries:
            unlisted += sorted(name for name in (os.path.join(folder, entry.name)
                                                 for entry in entries if entry.is_file()
                                                 and os.path.splitext(entry.name)[1].lower()
                                                 in IMAGE_EXTENSIONS)
                               if name not in listed)
    if unlisted:
        where = "" if folders == [""] else " or in the folders its rows name"
        logger.warning("warning: %s: %d image(s) beside %s%s have no row in it and are not "
                       "read (%s): add a row for each, or move them out of the folder",
                       table.root, len(unlisted), TABLE_NAME, where, first_few(unlisted))


def _inside(folder: str) -> bool:
    """Whether a table row's folder lies within the table's own folder (not "../images",
    which another split's table may share, nor an absolute path)."""
    return not os.path.isabs(folder) and folder.split(os.sep)[0] != os.pardir


def _reads_classes(task: str | None) -> bool:
    """Whether a run of `task` (None: not yet known, the targets decide) reads a table's
    one column of class indices as class labels."""
    return task is not None and make_task(task).class_labels


def open_folder(data_dir: str | Path | None, task: str | None = None
                ) -> tuple[FolderRecords, FolderRecords] | tuple[TableRecords, TableRecords]:
    """The training and held-out records of a data folder (`folder_splits`), same classes;
    split folders holding a `targets.csv` take their targets from it (`TableRecords`), read
    as class labels when `task` is "classification" and the tables hold one column of class
    indices (`as_class_labels`)."""
    if data_dir is None:
        raise DataError("data='folder' needs a data folder holding train/ and val/ (or "
                        "test/) folders with one subfolder per class: data_dir=PATH in "
                        "training settings, --data-dir PATH on the command line")
    train_dir, held_out_dir = folder_splits(data_dir)
    tables = [(d / TABLE_NAME).is_file() for d in (train_dir, held_out_dir)]
    if any(tables):
        if not all(tables):
            has, lacks = ((train_dir, held_out_dir) if tables[0] else
                          (held_out_dir, train_dir))
            raise DataError(f"{has / TABLE_NAME} gives targets but {lacks} has no "
                            f"{TABLE_NAME}: write one for {lacks.name}/ too (same columns)")
        train_table, held_table = TableRecords.scan(train_dir), TableRecords.scan(held_out_dir)
        for table in (train_table, held_table):
            warn_of_unlisted_images(table)
        check_same_columns(train_table, held_table)
        if _reads_classes(task):
            return as_class_labels(train_table, held_table) or (train_table, held_table)
        return train_table, held_table
    train, test = FolderRecords.scan(train_dir), FolderRecords.scan(held_out_dir)
    check_same_classes(train.classes, test.classes, train_dir, held_out_dir)
    return train, test


def open_held_out_folder(data_dir: str | Path, task: str | None = None
                         ) -> FolderRecords | TableRecords | None:
    """The held-out records of a data folder that has no train/ folder, for evaluation: its
    val/, validation/ or test/ folder, or else the folder itself when it holds class
    sub-folders (`root/<class_name>/<image>`) or a `targets.csv`. None when the folder has a
    train/ folder (`open_folder` reads both splits, checking they have the same classes)."""
    root = Path(data_dir).expanduser()
    _check_root(root, SPLITS_LAYOUT)
    if (root / "train").is_dir():
        return None
    held_out = next((root / sub for sub in ("val", "validation", "test")
                     if (root / sub).is_dir()), root)
    if (held_out / TABLE_NAME).is_file():
        table = TableRecords.scan(held_out)
        warn_of_unlisted_images(table)
        return held_out_class_labels(table) if _reads_classes(task) else table
    records = FolderRecords.scan(held_out)
    logger.info("%s has no train/ folder: evaluating the images of %s (%d classes)", root,
                held_out, len(records.classes))
    return records


def load_image_folder(root: str | Path, image_size: int | tuple[int, int] | None = None,
                      channels: int = 3, workers: int | None = None,
                      resize: bool = True) -> ImageDataset:
    """Decode every image under `root/<class_name>/` into an in-memory `ImageDataset`
    (`vitkit.data.in_memory.decode_into_memory`: sizes, channels, workers and skipped files)."""
    if channels not in (1, 3):
        raise DataError(f"channels must be 1 (grayscale) or 3 (RGB), got {channels}")
    size = size_hw(image_size)  # checked before the folder is listed
    return decode_into_memory(FolderRecords.scan(Path(root).expanduser()), size, channels,
                              workers, resize)
