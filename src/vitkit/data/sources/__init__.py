"""Named data sources -> (train, held-out) records: the one door, `open_source`.

One module per source: `digits` (embedded), `cifar` (CIFAR-10/100 binaries), `folder`
(class-per-folder images), `arrays` (.npz / .npy files) and `hf` (Hugging Face datasets).
Digits and CIFAR are small and always held in memory (`ImageDataset`); arrays are held in
memory, or read batch by batch from their files (`MappedArrays`) when large or asked to.
Folders and Hugging Face datasets are either decoded into memory (`vitkit.data.in_memory`) or
streamed as `ImageRecords` / `IterableRecords`, chosen by `mode`: "memory", "stream", or
"auto" (streamed when the images, decoded at the model's size, would take more than
`MEMORY_LIMIT_BYTES`; for arrays, their float32 images). `vitkit.data.feeds` turns any of
them into batches. `open_held_out_only` reads the one split of a data folder that holds no
training images, for evaluation.
"""

from __future__ import annotations

import logging

from vitkit.data.sources.records import ImageRecords, Records
from vitkit.errors import ConfigError, DataError, long_name

__all__ = ["DATA_MODES", "MEMORY_LIMIT_BYTES", "SOURCES", "Records", "is_known_source",
           "open_held_out_only", "open_source"]

SOURCES = ("digits", "cifar10", "cifar100", "folder", "arrays", "hf:NAME_OR_PATH")
DATA_MODES = ("auto", "memory", "stream")
# Read as held, never decoded and resized as read (arrays: in memory, or batch by batch from
# their files with data_mode=stream; `vitkit.analysis` reads their test split in memory).
IN_MEMORY_ONLY = ("digits", "cifar10", "cifar100", "arrays")
# "auto" streams a folder or Hugging Face dataset whose images, decoded at the model's size,
# would take more memory than this (about 14,000 RGB images at 224x224).
MEMORY_LIMIT_BYTES = 2 * 1024**3

log = logging.getLogger("vitkit.data")


def is_known_source(name: str) -> bool:
    return name in SOURCES[:-1] or (name.startswith("hf:") and len(name) > 3)


def open_source(name: str, data_dir: str | None = None,
                image_size: tuple[int, int] | None = None, channels: int = 3,
                train_limit: int | None = None, test_limit: int | None = None,
                mode: str = "auto", train_split: str | None = None,
                eval_split: str | None = None, streaming: bool = False,
                workers: int | None = None, task: str | None = None
                ) -> tuple[Records, Records]:
    """Train and held-out records of a source, in memory or streamed (see the module docstring).

    "arrays" reads `data_dir/train.npz` and `test.npz` (or `val.npz`), or split folders of
    .npy files (`vitkit.data.sources.arrays`). "folder" reads `data_dir/train/<class>/*` and
    `data_dir/val/<class>/*` (or `test/`).
    `train_split` / `eval_split` pick a Hugging Face dataset's splits (default: "train" and
    the first of validation, valid, val, test); `streaming` reads a Hugging Face dataset as
    an `IterableDataset` (no random access, nothing downloaded up front). `workers`: the
    processes that decode a folder or dataset into memory (None: by CPU count). `task`: the
    run's task when it is named (a folder's `targets.csv` of class indices gives class labels
    for "classification").
    """
    if mode not in DATA_MODES:
        raise ConfigError(f"data_mode={mode!r} is not one of {', '.join(DATA_MODES)}")
    if data_dir is not None and (name == "digits" or name.startswith("hf:")):
        raise ConfigError(f"a data folder ({data_dir}) was given, but data={name} reads none: "
                          "name the data the folder holds (data=folder, arrays, cifar10 or "
                          "cifar100; --data on the command line), or leave the folder out")
    if name == "arrays":
        if streaming:
            raise ConfigError("streaming=true is for data=hf:...; data=arrays reads large "
                              "arrays batch by batch from their files with data_mode=stream")
        from vitkit.data.sources.arrays import open_arrays

        return open_arrays(data_dir, train_limit, test_limit, mode, MEMORY_LIMIT_BYTES)
    if name in IN_MEMORY_ONLY:
        if mode == "stream" or streaming:
            raise ConfigError(f"data={name} is read into memory (it is small); data_mode=stream "
                              "and streaming=true are for data=folder and data=hf:...: drop "
                              "the setting")
        if name == "digits":
            from vitkit.data.sources.digits import open_digits

            return open_digits(train_limit, test_limit)
        from vitkit.data.sources.cifar import open_cifar

        return open_cifar(name, data_dir, train_limit, test_limit)
    if name == "folder":
        from vitkit.data.sources.folder import open_folder

        train, test = open_folder(data_dir, task)
    elif name.startswith("hf:") and len(name) > 3:
        from vitkit.data.sources.hf import load_hf_splits

        train, test = load_hf_splits(name[3:], train_split, eval_split, streaming, channels)
        for split in (train, test):  # a dataset's label names are its authors' strings
            problem = long_name(getattr(split, "classes", None) or ())
            if problem:
                raise DataError(f"{split.name}: among its label names, {problem}: give the "
                                "classes shorter names (Dataset.cast_column with a ClassLabel)")
        if streaming:
            return train, test
    else:
        raise DataError(f"unknown data source {name!r}: use one of {', '.join(SOURCES)}")
    if train_limit:
        train = _first(train, train_limit)
    if test_limit:
        test = _first(test, test_limit)
    if _in_memory(mode, len(train) + len(test), image_size, channels):
        from vitkit.data.in_memory import decode_into_memory

        return (decode_into_memory(train, image_size, channels, workers),
                decode_into_memory(test, image_size, channels, workers))
    log.info("streaming %s: %d training and %d held-out images, decoded as they are read",
             name, len(train), len(test))
    return train, test


def open_held_out_only(name: str, data_dir: str | None, image_size: tuple[int, int] | None,
                       channels: int = 3, limit: int | None = None, mode: str = "auto",
                       workers: int | None = None, task: str | None = None) -> Records | None:
    """The held-out records of a data folder that has no train/ folder (its val/ or test/
    folder, or its class sub-folders: `open_held_out_folder`), or of arrays (the training
    split checked against them, its images not read: `open_arrays_held_out`), in memory or
    streamed as `open_source` would read them, for evaluation; None for any other data,
    which `open_source` reads whole."""
    if name == "arrays":
        from vitkit.data.sources.arrays import open_arrays_held_out

        return open_arrays_held_out(data_dir, limit, mode, MEMORY_LIMIT_BYTES)
    if name != "folder" or data_dir is None:
        return None
    from vitkit.data.sources.folder import open_held_out_folder

    records = open_held_out_folder(data_dir, task)
    if records is None:
        return None
    if limit:
        records = _first(records, limit)
    if _in_memory(mode, len(records), image_size, channels):
        from vitkit.data.in_memory import decode_into_memory

        return decode_into_memory(records, image_size, channels, workers)
    return records


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
