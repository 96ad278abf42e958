"""Image folders whose targets come from a table: `<split>/targets.csv` with the header
`file,<name>,<name>...`, one row per image (its path relative to the split folder), one
numeric column per target. Float columns are regression targets; several 0/1 columns are
multi-label targets when the run asks for task=multilabel (`vitkit.tasks.infer_task`); either
way the records carry float32 (N, K) targets and `classes` = the column names. One column of
class indices (whole numbers from 0) is read as int64 (N,) class labels when the run asks for
task=classification (`as_class_labels`), its classes named "0".."K-1". No class sub-folders
are needed.
"""

from __future__ import annotations

import csv
import logging
import math
import os
from pathlib import Path

import numpy as np

from vitkit.data.image_decoder import DecodedImage, decode_image
from vitkit.errors import DataError, first_few, unclear_names

__all__ = ["TABLE_NAME", "TableRecords", "as_class_labels", "check_same_columns",
           "read_table"]

TABLE_NAME = "targets.csv"
FILE_COLUMN = "file"
log = logging.getLogger("vitkit.data")
# The smallest magnitude a float32 cast rounds to inf (its largest value plus half a step):
# what `vitkit.data.sources.mapped.beyond_float32` finds for arrays.
FLOAT32_OVERFLOW = 2.0**128 * (1 - 2.0**-25)


def read_table(split_dir: Path) -> tuple[list[str], list[str], np.ndarray]:
    """(relative file paths, target names, float32 (N, K) targets) of `split_dir/targets.csv`,
    every file checked to exist and every value to be a finite number."""
    table = split_dir / TABLE_NAME
    with open(table, newline="", encoding="utf-8-sig") as handle:
        rows = list(csv.reader(handle))
    if not rows:
        raise DataError(f"{table} is empty: write a header `file,<name>,...` and one row per "
                        "image")
    header = [name.strip() for name in rows[0]]
    if FILE_COLUMN not in header:
        raise DataError(f"{table} has no `{FILE_COLUMN}` column (its header is "
                        f"{','.join(header)}): the first line should read "
                        f"`file,<target name>,...`, each row an image path relative to "
                        f"{split_dir} and its target values")
    at = header.index(FILE_COLUMN)
    names = [name for i, name in enumerate(header) if i != at]
    if not names:
        raise DataError(f"{table} has no target columns: add one column per target "
                        "(`file,<name>,...`)")
    problem = unclear_names(names)
    if problem:
        raise DataError(f"{table}: among the target column names, {problem}; give each "
                        "column a name of its own in the header (reports list their figures "
                        "by name)")
    body = [(line, row) for line, row in enumerate(rows[1:], 2) if any(c.strip() for c in row)]
    if not body:
        raise DataError(f"{table} has a header but no rows: add one row per image "
                        f"(`path/to/image.png,{','.join('<value>' for _ in names)}`)")
    paths: list[str] = []
    targets = np.empty((len(body), len(names)), dtype=np.float32)
    for n, (line, row) in enumerate(body):
        if len(row) != len(header):
            raise DataError(f"{table} line {line} has {len(row)} values but the header names "
                            f"{len(header)} columns: give each row a file and "
                            f"{len(names)} target value(s)")
        file = row[at].strip()
        if not (split_dir / file).is_file():
            raise DataError(f"{table} line {line} names {file!r}, but {split_dir / file} does "
                            "not exist: fix the path (relative to the table's folder) or "
                            "drop the row")
        paths.append(file)
        values = [cell for i, cell in enumerate(row) if i != at]
        for k, (name, cell) in enumerate(zip(names, values, strict=True)):
            targets[n, k] = _number(cell, table, line, name)
    _warn_of_repeated_files(table, paths, [line for line, _ in body])
    return paths, names, targets


def _warn_of_repeated_files(table: Path, paths: list[str], lines: list[int]) -> None:
    """Warn of a file named by more than one row: each row is an image of its own, so the file
    counts twice (with conflicting targets where the rows differ)."""
    rows_of: dict[str, list[int]] = {}
    for path, line in zip(paths, lines, strict=True):
        rows_of.setdefault(os.path.normpath(path), []).append(line)
    repeated = [f"{path} (lines {', '.join(map(str, at))})" for path, at in rows_of.items()
                if len(at) > 1]
    if repeated:
        log.warning("warning: %s: %d file(s) have more than one row, %s: each row is read as "
                    "an image of its own, so they count more than once; drop the extra rows",
                    table, len(repeated), first_few(repeated))


def _number(cell: str, table: Path, line: int, column: str) -> float:
    try:
        value = float(cell)
    except ValueError:
        raise DataError(f"{table} line {line}, column {column!r}: {cell.strip()!r} is not a "
                        "number; every target column holds numbers only (a column of class "
                        "names belongs in class sub-folders, or encode it as 0/1 columns)"
                        ) from None
    if not math.isfinite(value):
        raise DataError(f"{table} line {line}, column {column!r}: {cell.strip()!r} is not a "
                        "finite number; drop or fix the row")
    if abs(value) >= FLOAT32_OVERFLOW:  # a comparison per cell, not an array cast
        raise DataError(f"{table} line {line}, column {column!r}: {cell.strip()!r} is beyond "
                        "float32's range (|x| > 3.4e38), which targets are held in; rescale "
                        "the column (other units, or a log)")
    return value


def check_same_columns(train: TableRecords, held_out: TableRecords) -> None:
    """Refuse held-out targets named otherwise than the training targets."""
    if train.classes != held_out.classes:
        raise DataError(f"{held_out.root / TABLE_NAME} has the target columns "
                        f"{', '.join(held_out.classes)} but {train.root / TABLE_NAME} has "
                        f"{', '.join(train.classes)}: both tables need the same columns in "
                        "the same order")


def as_class_labels(train: TableRecords, held_out: TableRecords
                    ) -> tuple[TableRecords, TableRecords] | None:
    """Both tables read as class labels, for task=classification: their one target column as
    int64 (N,) class indices, classes "0".."K-1" (K: the largest index of either split + 1).
    None when the training table has several columns or a value that is not a whole number
    from 0, so its targets stay float and the task check (`vitkit.tasks.infer_task`) says
    why; a held-out value that is no class index is refused, naming its row."""
    if not _class_indices(train.labels):
        return None
    if not _class_indices(held_out.labels):
        column = held_out.labels[:, 0]
        row = int(np.argmax((column < 0) | (column != np.round(column))))
        raise DataError(f"{held_out.root / TABLE_NAME}: the row of {held_out.paths[row]} holds "
                        f"{column[row]:g}, but {train.root / TABLE_NAME} holds class indices "
                        "(whole numbers from 0) for task=classification: give it the class "
                        "index of its image (or drop the row)")
    count = int(max(train.labels.max(), held_out.labels.max())) + 1
    occurring = len(np.union1d(train.labels[:, 0], held_out.labels[:, 0]))
    if occurring < count // 2:
        raise DataError(f"{train.root / TABLE_NAME}: the class indices run to {count - 1} but "
                        f"only {occurring} occur (with {held_out.root.name}/'s), so the head "
                        f"would have {count} outputs, most never trained: number the classes "
                        f"0..{occurring - 1} in both tables")
    missing = np.setdiff1d(np.arange(count), train.labels[:, 0])
    if len(missing):
        shown = first_few(int(i) for i in missing)
        log.warning("warning: %s: class index(es) %s never occur in it, so their outputs are "
                    "never trained%s", train.root / TABLE_NAME, shown,
                    "; are the indices counted from 1? number the classes from 0"
                    if missing[0] == 0 else "")
    return _relabelled(train, count), _relabelled(held_out, count)


def held_out_class_labels(table: TableRecords) -> TableRecords:
    """A held-out table alone (a folder of test images only) read as class labels, for
    task=classification: its one column of whole numbers from 0 as int64 class indices,
    classes "0".."K-1" (K: its largest index + 1; the model's head may have more, which
    evaluation matches by name). A table of other targets is returned as it is, for the task
    check to refuse."""
    if not _class_indices(table.labels):
        return table
    return _relabelled(table, int(table.labels.max()) + 1)


def _relabelled(table: TableRecords, count: int) -> TableRecords:
    """`table`'s one column as int64 class indices of the classes "0".."count-1"."""
    classes = [str(index) for index in range(count)]
    return TableRecords(table.root, table.paths, classes, table.labels[:, 0].astype(np.int64))


def _class_indices(targets: np.ndarray) -> bool:
    """Whether float32 (N, K) table targets are one column of whole numbers from 0."""
    column = targets[:, 0]
    return targets.shape[1] == 1 and bool(np.all(column >= 0)) and \
        bool(np.all(column == np.round(column)))


class TableRecords:
    """`ImageRecords` over the rows of a `targets.csv`: `labels` float32 (N, K) and `classes`
    the target names (or, `as_class_labels`, int64 (N,) class indices and their names),
    images decoded from `root/<file>` as they are read."""

    streamed = True  # decoded from the files as read

    def __init__(self, root: Path, paths: list[str], classes: list[str],
                 targets: np.ndarray) -> None:
        self.root, self.name = root, root.name
        self.paths, self.classes, self._labels = paths, classes, targets

    @classmethod
    def scan(cls, root: str | Path) -> TableRecords:
        root = Path(root).expanduser().resolve()
        return cls(root, *read_table(root))

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def labels(self) -> np.ndarray:
        return self._labels

    def relative_path(self, index: int) -> str:
        return self.paths[index]

    def where(self, index: int) -> str:
        return str(self.root / self.paths[index])

    def read(self, index: int, channels: int) -> DecodedImage:
        return decode_image(self.where(index), channels)

    def subset(self, count: int) -> TableRecords:
        """The first `count` rows."""
        return TableRecords(self.root, self.paths[:count], self.classes, self._labels[:count])
