"""Named data sources -> (train, test) data: the embedded digits, CIFAR, image folders and
Hugging Face datasets.

`load_source` always returns in-memory `ImageDataset`s. `open_source` (what training and
evaluation use) returns in-memory sets for digits and CIFAR, and for folders and Hugging Face
datasets either in-memory sets or streamed `ImageRecords`, chosen by `mode`: "memory",
"stream", or "auto" (streamed when the images, decoded at the model's size, would take more
than `MEMORY_LIMIT_BYTES`).
"""

from __future__ import annotations

import logging

from vitkit.data.dataset import DataError, ImageDataset
from vitkit.data.sources.records import ImageRecords, IterableRecords
from vitkit.errors import ConfigError

SOURCES = ("digits", "cifar10", "cifar100", "folder", "hf:NAME_OR_PATH")
DATA_MODES = ("auto", "memory", "stream")
IN_MEMORY_ONLY = ("digits", "cifar10", "cifar100")
# "auto" streams a folder or Hugging Face dataset whose images, decoded at the model's size,
# would take more memory than this (about 14,000 RGB images at 224x224).
MEMORY_LIMIT_BYTES = 2 * 1024**3

Data = ImageDataset | ImageRecords | IterableRecords
log = logging.getLogger("vitkit.data")


def is_known_source(name: str) -> bool:
    return name in SOURCES[:-1] or (name.startswith("hf:") and len(name) > 3)


def load_source(name: str, data_dir: str | None = None, image_size: tuple[int, int] | None = None,
                channels: int = 3, train_limit: int | None = None,
                test_limit: int | None = None) -> tuple[ImageDataset, ImageDataset]:
    """Train and test splits of a data source, decoded into memory.

    "folder" reads `data_dir/train/<class>/*` and `data_dir/val/<class>/*` (or `test/`).
    """
    if name.startswith("hf:"):
        train, test = open_source(name, data_dir, image_size, channels, train_limit, test_limit,
                                  mode="memory")
        assert isinstance(train, ImageDataset) and isinstance(test, ImageDataset)
        return train, test
    if name == "digits":
        from vitkit.data.builtin import load_digits

        train, test = load_digits("train"), load_digits("test")
    elif name in ("cifar10", "cifar100"):
        from vitkit.data.cifar import find_cifar_dir, load_cifar

        root = find_cifar_dir(name, data_dir)
        train = load_cifar(root, "train", name, limit=train_limit)
        test = load_cifar(root, "test", name, limit=test_limit)
    elif name == "folder":
        from vitkit.data.folder import load_image_folder
        from vitkit.data.sources.folder_index import check_same_classes, folder_splits

        if data_dir is None:
            raise DataError("data='folder' needs data_dir=PATH holding train/ and val/ (or "
                            "test/) folders with one subfolder per class")
        train_dir, held_out_dir = folder_splits(data_dir)
        train = load_image_folder(train_dir, image_size, channels)
        test = load_image_folder(held_out_dir, image_size, channels)
        check_same_classes(train.classes, test.classes, train_dir, held_out_dir)
    else:
        raise DataError(f"unknown data source {name!r}: use one of {', '.join(SOURCES)}")
    if train_limit:
        train = train.subset(slice(0, train_limit))
    if test_limit:
        test = test.subset(slice(0, test_limit))
    return train, test


def open_source(name: str, data_dir: str | None = None,
                image_size: tuple[int, int] | None = None, channels: int = 3,
                train_limit: int | None = None, test_limit: int | None = None,
                mode: str = "auto", train_split: str | None = None,
                eval_split: str | None = None, streaming: bool = False,
                workers: int | None = None) -> tuple[Data, Data]:
    """Train and held-out data of a source, in memory or streamed (see the module docstring).

    `train_split` / `eval_split` pick a Hugging Face dataset's splits (default: "train" and
    the first of validation, valid, val, test); `streaming` reads a Hugging Face dataset as
    an `IterableDataset` (no random access, nothing downloaded up front).
    """
    if mode not in DATA_MODES:
        raise ConfigError(f"data_mode={mode!r} is not one of {', '.join(DATA_MODES)}")
    if name in IN_MEMORY_ONLY:
        if mode == "stream" or streaming:
            raise ConfigError(f"data={name} is read into memory (it is small); data_mode=stream "
                              "and streaming=true are for data=folder and data=hf:...: drop "
                              "the setting")
        return load_source(name, data_dir, image_size, channels, train_limit, test_limit)
    if name == "folder":
        train, test = _folder_records(data_dir)
    elif name.startswith("hf:") and len(name) > 3:
        from vitkit.data.sources.hf import load_hf_splits

        train, test = load_hf_splits(name[3:], train_split, eval_split, streaming, channels)
        if streaming:
            return train, test
    else:
        raise DataError(f"unknown data source {name!r}: use one of {', '.join(SOURCES)}")
    if train_limit:
        train = _first(train, train_limit)
    if test_limit:
        test = _first(test, test_limit)
    if _in_memory(mode, len(train) + len(test), image_size, channels):
        if name == "folder":
            return load_source(name, data_dir, image_size, channels, train_limit, test_limit)
        from vitkit.data.streaming import to_memory

        return (to_memory(train, image_size, channels, workers),
                to_memory(test, image_size, channels, workers))
    log.info("streaming %s: %d training and %d held-out images, decoded as they are read",
             name, len(train), len(test))
    return train, test


def _folder_records(data_dir: str | None) -> tuple[ImageRecords, ImageRecords]:
    from vitkit.data.sources.folder_index import FolderRecords, check_same_classes, folder_splits

    if data_dir is None:
        raise DataError("data='folder' needs data_dir=PATH holding train/ and val/ (or "
                        "test/) folders with one subfolder per class")
    train_dir, held_out_dir = folder_splits(data_dir)
    train, test = FolderRecords.scan(train_dir), FolderRecords.scan(held_out_dir)
    check_same_classes(train.classes, test.classes, train_dir, held_out_dir)
    return train, test


def _first(records: ImageRecords, count: int) -> ImageRecords:
    if hasattr(records, "subset"):
        return records.subset(count)
    from vitkit.data.sources.subset import FirstRecords

    return FirstRecords(records, count)


def _in_memory(mode: str, count: int, image_size: tuple[int, int] | None,
               channels: int) -> bool:
    if mode != "auto":
        return mode == "memory"
    if image_size is None:
        return False
    return count * channels * image_size[0] * image_size[1] <= MEMORY_LIMIT_BYTES

