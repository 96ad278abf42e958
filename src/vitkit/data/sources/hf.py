"""Hugging Face datasets as labelled image records (`data=hf:NAME_OR_PATH`).

Columns are found by feature type: the image is the `datasets.Image` column, the label the
`ClassLabel` column (its `names` are the classes), else an integer column named label, labels,
fine_label or target (classes "0".."K-1"). Beyond classes (`TARGET_KINDS`): a list column of
`ClassLabel` (`Sequence(ClassLabel)`) or of integers gives multi-hot float32 (N, K) targets
named by the ClassLabel names (multi-label, task=multilabel); a float column (Value float16/32/
64) gives float32 (N, 1) regression targets named by the column. Those are read map-style only
(streaming=false). Images are read undecoded (bytes or path) and decoded by vitkit's one
decoder, `vitkit.data.image_decoder.decode_image`, so a damaged image in a dataset is refused
like a damaged file. Splits: training "train"; evaluation the first of validation, valid, val,
test; both can be named; a set of one split is told how to hold part of it out as validation
(`hf_open.hold_out_command`). Where SPEC is looked for: `vitkit.data.sources.hf_open`.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Iterator, Mapping

import numpy as np
from datasets import ClassLabel, Dataset, Features, Image, IterableDataset, Sequence, Value
from datasets.distributed import split_dataset_by_node

try:  # datasets >= 4 names list columns List (Sequence(X) builds one)
    from datasets import List
except ImportError:  # pragma: no cover
    List = None
from datasets.utils.file_utils import xopen

from vitkit.data.image_decoder import DecodedImage, decode_image
from vitkit.data.sources.hf_open import hold_out_command, open_hf_splits
from vitkit.data.sources.mapped import beyond_float32
from vitkit.errors import DataError, MissingSplit, first_few

__all__ = ["EVAL_SPLITS", "LABEL_NAMES", "TRAIN_SPLIT", "HFImageRecords", "HFStreamRecords",
           "load_hf_split", "load_hf_splits"]

logger = logging.getLogger("vitkit.data")

TRAIN_SPLIT = "train"
EVAL_SPLITS = ("validation", "valid", "val", "test")  # the first one present evaluates
LABEL_NAMES = ("label", "labels", "fine_label", "target")  # integer label columns, by preference
IMAGE_NAMES = ("image", "img")  # preferred when a set has several Image columns
SHUFFLE_BUFFER = 1000  # records held by a streamed set's shuffle buffer
HOLD_OUT_FRACTION = 0.1  # of a set's one split, advised as its validation split


def _type_name(feature: object) -> str:
    if isinstance(feature, ClassLabel):
        return f"ClassLabel({feature.num_classes} names)"
    if isinstance(feature, Value):
        return feature.dtype
    return type(feature).__name__


def _describe(features: Features) -> str:
    return ", ".join(f"{name} ({_type_name(feature)})" for name, feature in features.items())


def _pick(candidates: list[str], preferred: tuple[str, ...]) -> str | None:
    if len(candidates) == 1:
        return candidates[0]
    return next((name for name in preferred if name in candidates), None)


def _image_column(features: Features, where: str) -> str:
    images = [name for name, feature in features.items() if isinstance(feature, Image)]
    column = _pick(images, IMAGE_NAMES)
    if column is None:
        problem = (f"has several Image columns ({', '.join(images)}) and none is named image"
                   if images else "has no Image column")
        raise DataError(f"{where} {problem}: its columns are {_describe(features)}. vitkit needs "
                        f"one datasets.Image column (cast one with ds.cast_column(NAME, "
                        f"datasets.Image()) or drop the others, then save_to_disk and pass that "
                        f"folder)")
    return column


def _list_of(feature: object) -> object | None:
    """The item feature of a list column (`Sequence(X)` / `List(X)`), else None."""
    if isinstance(feature, (Sequence, *((List,) if List is not None else ()))):
        return feature.feature
    if isinstance(feature, list) and len(feature) == 1:
        return feature[0]
    return None


def _is_int(feature: object) -> bool:
    return isinstance(feature, Value) and "int" in feature.dtype


def _label_column(features: Features, where: str) -> tuple[str, list[str] | None, str]:
    """The label column, its names (None: integers without names) and its kind: "class",
    "label list" (a list column: multi-label targets) or "float" (a float column:
    regression targets)."""
    class_labels = [name for name, f in features.items() if isinstance(f, ClassLabel)]
    column = _pick(class_labels, LABEL_NAMES)
    if column is not None:
        return column, list(features[column].names), "class"
    integers = [name for name in LABEL_NAMES if name in features and _is_int(features[name])]
    if integers:
        return integers[0], None, "class"
    lists = [name for name, f in features.items()
             if isinstance(_list_of(f), ClassLabel) or _is_int(_list_of(f))]
    column = _pick(lists, LABEL_NAMES)
    if column is not None:
        item = _list_of(features[column])
        return column, list(item.names) if isinstance(item, ClassLabel) else None, "label list"
    floats = [name for name, f in features.items()
              if isinstance(f, Value) and f.dtype.startswith("float")]
    column = _pick(floats, LABEL_NAMES)
    if column is not None:
        return column, [column], "float"
    several = (f"several ClassLabel columns ({', '.join(class_labels)}) and none is named "
               f"{'/'.join(LABEL_NAMES)}; " if class_labels else "")
    raise DataError(f"{where} has no label column vitkit can use: {several}its columns are "
                    f"{_describe(features)}. vitkit needs a ClassLabel column, or an integer "
                    f"column named {', '.join(LABEL_NAMES)} (string labels: "
                    f"ds = ds.class_encode_column(NAME), then ds.save_to_disk(DIR) and pass "
                    f"data=hf:DIR); for other tasks a float column (regression) or a "
                    f"Sequence(ClassLabel) column (multi-label), named "
                    f"{'/'.join(LABEL_NAMES)} when there are several")


def _targets(dataset: Dataset, column: str, names: list[str] | None, kind: str,
             where: str) -> tuple[np.ndarray, list[str]]:
    """float32 (N, K) targets of a "label list" (multi-hot) or "float" column, and their
    names."""
    if kind == "float":
        values = np.asarray(dataset.select_columns([column]).with_format("numpy")[column],
                            dtype=np.float64).reshape(-1, 1)
        for bad, problem, fix in (
                (~np.isfinite(values[:, 0]), "missing, NaN or inf",
                 "drop those rows (ds.filter) or fix them"),
                (beyond_float32(values), "beyond float32's range (|x| > 3.4e38)",
                 "rescale the column (ds.map: other units, or a log)")):
            at = np.flatnonzero(bad)
            if len(at):
                raise DataError(f"{where}: {len(at)} value(s) of column {column!r} are "
                                f"{problem}, at index {first_few(at)}; {fix}")
        return values.astype(np.float32), list(names or [column])
    rows = dataset.select_columns([column])[column]
    top = max((max(row) for row in rows if row), default=-1)
    names = names if names is not None else [str(k) for k in range(top + 1)]
    targets = np.zeros((len(rows), len(names)), dtype=np.float32)
    for index, row in enumerate(rows):
        if row and (min(row) < 0 or max(row) >= len(names)):
            raise DataError(f"{where}: record {index} of column {column!r} holds labels "
                            f"{list(row)}, outside 0..{len(names) - 1}; fix or drop it")
        targets[index, list(row)] = 1.0
    return targets, names


def _image_source(stored: Mapping[str, object]) -> bytes | str | io.BytesIO:
    """What `decode_image` reads for an undecoded `datasets.Image` value {"bytes", "path"}."""
    data, path = stored.get("bytes"), stored.get("path")
    if data is not None:
        return data
    if path and os.path.exists(path):
        return path
    if path:  # a remote file of a streamed set (hf://...): its bytes
        with xopen(path, "rb") as handle:
            return io.BytesIO(handle.read())
    return b""


class HFImageRecords:
    """A map-style split as `ImageRecords`: `read(i)` decodes record i; `labels` decode nothing."""

    streamed = True

    def __init__(self, dataset: Dataset, name: str, image_column: str, label_column: str,
                 classes: list[str], targets: np.ndarray | None = None) -> None:
        """`targets`: float32 (N, K) targets to use instead of reading `label_column` as
        class indices."""
        self.name, self.classes = name, classes
        images = dataset.select_columns([image_column])
        self._images = images.cast_column(image_column, Image(decode=False))
        self._image_column = image_column
        if targets is None:
            labels = dataset.select_columns([label_column]).with_format("numpy")[label_column]
            targets = np.asarray(labels, dtype=np.int64)
        self._labels = targets

    def __len__(self) -> int:
        return len(self._labels)

    def widen_classes(self, count: int) -> None:
        """Counted class names "0".."count-1" (see `_agree_on_counted_classes`); multi-hot
        targets gain zero columns."""
        extra = count - len(self.classes)
        self.classes = [str(k) for k in range(count)]
        if self._labels.ndim == 2 and extra > 0:
            self._labels = np.pad(self._labels, ((0, 0), (0, extra)))

    @property
    def labels(self) -> np.ndarray:
        """int64 (N,) class indices, or float32 (N, K) targets."""
        return self._labels

    def read(self, index: int, channels: int) -> DecodedImage:
        stored = self._images[int(index)][self._image_column]
        return decode_image(_image_source(stored), channels)

    def where(self, index: int) -> str:
        return f"{self.name}[{index}]"


class HFStreamRecords:
    """A streamed split as `IterableRecords`: seeded buffer shuffle, one share per rank, skip."""

    streamed = True
    labels = None  # known only as the stream is read

    def __init__(self, stream: IterableDataset, name: str, image_column: str, label_column: str,
                 classes: list[str], num_records: int | None,
                 shuffle_buffer: int = SHUFFLE_BUFFER) -> None:
        self.name, self.classes, self.num_records = name, classes, num_records
        self.shuffle_buffer = shuffle_buffer
        stream = stream.select_columns([image_column, label_column])
        self._stream = stream.cast_column(image_column, Image(decode=False))
        self._image_column, self._label_column = image_column, label_column

    def widen_classes(self, count: int) -> None:
        """Counted class names "0".."count-1" (see `_agree_on_counted_classes`)."""
        self.classes = [str(k) for k in range(count)]

    def _share(self, epoch: int, seed: int, rank: int, world_size: int) -> IterableDataset:
        stream = self._stream
        if self.shuffle_buffer > 1:
            stream = stream.shuffle(seed=seed, buffer_size=self.shuffle_buffer)
        share = split_dataset_by_node(stream, rank=rank, world_size=world_size)
        share.set_epoch(epoch)  # after the split, which starts its copy at epoch 0
        return share

    def iterate(self, epoch: int, seed: int, rank: int, world_size: int, channels: int,
                skip: int = 0) -> Iterator[tuple[DecodedImage, int, str]]:
        for position, row in enumerate(self._share(epoch, seed, rank, world_size)):
            if position < skip:
                continue  # skipped records are read but not decoded
            stored = row[self._image_column]
            origin = f": {stored['path']}" if stored.get("path") else ""
            where = (f"{self.name} (epoch {epoch}, rank {rank} of {world_size}, record "
                     f"{position}{origin})")
            yield decode_image(_image_source(stored), channels), int(row[self._label_column]), where


def _features(part: Dataset | IterableDataset) -> Features:
    if part.features is None:  # a stream whose features are only known from its first rows
        part = part._resolve_features()  # datasets' own way to learn them
    return part.features


def _checked_classes(labels: np.ndarray, classes: list[str] | None, column: str,
                     where: str, splits: list[str]) -> list[str]:
    if classes is None:
        classes = [str(k) for k in range(int(labels.max()) + 1 if len(labels) else 0)]
        logger.info("%s: label column %r is an integer column, not a ClassLabel: classes are "
                    "named %r..%r", where, column, classes[0] if classes else "", classes[-1]
                    if classes else "")
    bad = int(((labels < 0) | (labels >= len(classes))).sum())
    if bad:
        raise DataError(f"{where}: {bad} of {len(labels)} records have no valid label (-1 or "
                        f"outside 0..{len(classes) - 1} in column {column!r}); an unlabelled "
                        f"split cannot train or evaluate: choose another with train_split= / "
                        f"split= (splits found: {', '.join(splits)})")
    return classes


def _records(spec: str, split: str, part: Dataset | IterableDataset, splits: list[str],
             streaming: bool) -> HFImageRecords | HFStreamRecords:
    where = f"hf:{spec} {split}"
    features = _features(part)
    known_size = len(part) if isinstance(part, Dataset) else None
    if streaming and isinstance(part, Dataset):  # a local set streamed: testable offline
        part = part.to_iterable_dataset(num_shards=max(1, min(len(part), 64)))
    image_column = _image_column(features, where)
    label_column, classes, kind = _label_column(features, where)
    if kind != "class":
        if not isinstance(part, Dataset):
            raise DataError(f"{where}: column {label_column!r} holds "
                            f"{'label lists' if kind == 'label list' else 'float targets'}, "
                            "which are read from a prepared dataset: use streaming=false")
        targets, names = _targets(part, label_column, classes, kind, where)
        return HFImageRecords(part, where, image_column, label_column, names, targets)
    if isinstance(part, Dataset):
        records = HFImageRecords(part, where, image_column, label_column, classes or [])
        records.classes = _checked_classes(records.labels, classes, label_column, where, splits)
        return records
    if classes is None:  # plain integer labels: their range is known only by reading them all
        logger.info("%s: reading the label column once to count the classes", where)
        labels = np.fromiter((row[label_column] for row in part.select_columns([label_column])),
                             dtype=np.int64)
        classes = _checked_classes(labels, None, label_column, where, splits)
    info = part.info.splits.get(split) if part.info and part.info.splits else None
    num_records = info.num_examples if info and info.num_examples else known_size
    return HFStreamRecords(part, where, image_column, label_column, classes, num_records)


# The TrainConfig keys (and `vitkit eval --split`) that choose each split.
_KEYS = {"train": "train_split=", "eval": "split="}
_EVAL_FLAG = " (vitkit eval: --split NAME)"  # the verbs' flag for the held-out split


def _choose(spec: str, splits: Mapping[str, object], wanted: str | None, role: str) -> str:
    found = ", ".join(splits)
    if wanted is not None:
        if wanted not in splits:
            raise MissingSplit(f"hf:{spec} has no split {wanted!r} for {role}; its splits are "
                            f"{found}: pass one of them as {_KEYS[role]}"
                            + (_EVAL_FLAG if role == "eval" else ""))
        return wanted
    defaults = (TRAIN_SPLIT,) if role == "train" else EVAL_SPLITS
    chosen = next((name for name in defaults if name in splits), None)
    if chosen is None and role == "eval" and len(splits) == 1:
        raise DataError(_only_one_split_message(spec, next(iter(splits))))
    if chosen is None:
        held_out = "" if role == "train" else " (a held-out split, not the training one)"
        raise DataError(f"hf:{spec} has no {'/'.join(defaults)} split for {role}; its splits "
                        f"are {found}: pass {_KEYS[role]}NAME{held_out}"
                        + (_EVAL_FLAG if role == "eval" else ""))
    return chosen


def _only_one_split_message(spec: str, split: str) -> str:
    """What to do with a set of one split: hold part of it out (`hold_out_command`)."""
    command, folder = hold_out_command(spec, split, HOLD_OUT_FRACTION)
    return (f"hf:{spec} has only a {split!r} split, and no held-out split "
            f"({', '.join(EVAL_SPLITS)}) to evaluate on. Hold out part of {split} as a "
            f"validation split ({HOLD_OUT_FRACTION:.0%} here) and save both: {command}; then "
            f"pass data=hf:{folder} (--data hf:{folder})")


def load_hf_splits(spec: str, train_split: str | None = None, eval_split: str | None = None,
                   streaming: bool = False, channels: int = 3
                   ) -> tuple[HFImageRecords | HFStreamRecords, HFImageRecords | HFStreamRecords]:
    """Training and evaluation records of `spec` (what follows "hf:").

    Map-style `HFImageRecords` (`ImageRecords`), or `HFStreamRecords` (`IterableRecords`) when
    `streaming`. Splits default to "train" and the first of validation, valid, val, test.
    """
    _check_channels(channels)
    splits = open_hf_splits(spec, streaming)
    train_name = _choose(spec, splits, train_split, "train")
    eval_name = _choose(spec, splits, eval_split, "eval")
    names = list(splits)
    train = _records(spec, train_name, splits[train_name], names, streaming)
    held_out = _records(spec, eval_name, splits[eval_name], names, streaming)
    _agree_on_counted_classes(spec, train, held_out)
    if train.classes != held_out.classes:
        raise DataError(f"hf:{spec}: split {train_name!r} has classes {_few(train.classes)} but "
                        f"{eval_name!r} has {_few(held_out.classes)}: pass splits of one "
                        f"labelling with train_split= / split=")
    return train, held_out


def _few(classes: list[str]) -> str:
    return str(classes[:5])[:-1] + (", ...]" if len(classes) > 5 else "]")


def _agree_on_counted_classes(spec: str, train: HFImageRecords | HFStreamRecords,
                              held_out: HFImageRecords | HFStreamRecords) -> None:
    """Integer labels (a class column or label lists that are not ClassLabel) name their
    classes "0".."K-1", K counted from the largest label of each split: both splits take the
    larger K, as data=arrays does (a held-out split that happens to lack the highest label is
    not another labelling); labels only the held-out split has are warned of, as there."""
    parts = (train, held_out)
    if not all(part.classes == [str(k) for k in range(len(part.classes))] for part in parts):
        return
    count = max(len(part.classes) for part in parts)
    if len(train.classes) < count:
        logger.warning("warning: hf:%s: class index(es) %s occur in the held-out split but "
                       "never in training, so their outputs are never trained", spec,
                       first_few(range(len(train.classes), count)))
    for part in parts:
        if len(part.classes) < count:
            part.widen_classes(count)


def load_hf_split(spec: str, split: str | None = None, streaming: bool = False,
                  channels: int = 3) -> HFImageRecords | HFStreamRecords:
    """One split of `spec` (default: the evaluation split), e.g. for `vitkit eval`."""
    _check_channels(channels)
    splits = open_hf_splits(spec, streaming)
    name = _choose(spec, splits, split, "eval")
    return _records(spec, name, splits[name], list(splits), streaming)


def _check_channels(channels: int) -> None:
    if channels not in (1, 3):
        raise DataError(f"Hugging Face images decode to 1 (grayscale) or 3 (RGB) channels, not "
                        f"{channels}: use a model with in_chans 1 or 3")
