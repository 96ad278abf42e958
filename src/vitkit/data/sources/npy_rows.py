"""One array stored in a file, read by rows without loading it: a `.npy` file, or an `.npy`
member stored uncompressed inside an `.npz` (what `numpy.savez` writes).

`open_array` parses the `.npy` header (never unpickling: object arrays are refused) and finds
where the data starts; `ArrayFile.rows(indices)` reads just those rows with `os.pread`, one
read per contiguous run. Nothing is memory-mapped, so the pages read count toward the page
cache, not toward the process's RSS: reading every row of a large file keeps RSS flat.
A compressed member (`numpy.savez_compressed`) or a Fortran-ordered array cannot be read by
rows: `open_array` says so (`ArrayFile` is None) and the caller loads it whole.
"""

from __future__ import annotations

import os
import struct
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vitkit.errors import DataError

__all__ = ["ArrayFile", "check_dtype", "npz_members", "open_array"]

_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")  # a zip member's local file header
_LOCAL_MAGIC = b"PK\x03\x04"


def check_dtype(dtype: np.dtype, where: str) -> None:
    """Refuse arrays that are not plain numbers (object/pickled, text, complex, records)."""
    if dtype.hasobject:
        raise DataError(f"{where} holds Python objects (a pickled object array), which vitkit "
                        "does not load (unpickling can run code): save plain numbers, e.g. "
                        "numpy.asarray(x, dtype=numpy.float32)")
    if not (np.issubdtype(dtype, np.integer) or np.issubdtype(dtype, np.floating)
            or dtype == np.bool_):
        raise DataError(f"{where} has dtype {dtype}, not numbers: save integers or floats, "
                        "e.g. numpy.asarray(x, dtype=numpy.float32)")


@dataclass(frozen=True)
class ArrayFile:
    """A C-ordered array of `shape` and `dtype` at byte `offset` of `path`."""

    path: Path
    offset: int
    shape: tuple[int, ...]
    dtype: np.dtype

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.row_bytes * len(self)

    def rows(self, indices: np.ndarray) -> np.ndarray:
        """Rows `indices` (any order, repeats allowed) as an array of this dtype: sorted, one
        read per run of consecutive rows."""
        indices = np.asarray(indices, dtype=np.int64)
        out = np.empty((len(indices), *self.shape[1:]), dtype=self.dtype)
        if not len(indices):
            return out
        order = np.argsort(indices, kind="stable")
        wanted = indices[order]
        if wanted[0] < 0 or wanted[-1] >= len(self):
            raise IndexError(f"rows {wanted[0]}..{wanted[-1]} of {len(self)}")
        flat = out.reshape(len(indices), -1).view(np.uint8)
        size = self.row_bytes
        fd = os.open(self.path, os.O_RDONLY)
        try:
            starts = np.flatnonzero(np.diff(wanted, prepend=wanted[0] - 2) != 1)
            ends = np.append(starts[1:], len(wanted))
            for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
                first, count = int(wanted[start]), end - start  # consecutive distinct rows
                buffer = _pread(fd, count * size, self.offset + first * size, self.path)
                flat[order[start:end]] = np.frombuffer(buffer, np.uint8).reshape(count, size)
        finally:
            os.close(fd)
        return out

    def chunks(self, rows: int, count: int | None = None) -> Iterator[np.ndarray]:
        """The first `count` rows (default all) in order, `rows` at a time."""
        total = len(self) if count is None else min(count, len(self))
        for start in range(0, total, rows):
            yield self.rows(np.arange(start, min(start + rows, total)))


def _pread(fd: int, size: int, offset: int, path: Path) -> bytes:
    parts, done = [], 0
    while done < size:
        part = os.pread(fd, size - done, offset + done)
        if not part:
            raise DataError(f"{path} ends before its array does (truncated file?): write it "
                            "again")
        parts.append(part)
        done += len(part)
    return b"".join(parts) if len(parts) > 1 else parts[0]


def _header(handle, where: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    try:
        version = np.lib.format.read_magic(handle)
        reader = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                  else np.lib.format.read_array_header_2_0)
        shape, fortran, dtype = reader(handle)
    except ValueError as err:
        raise DataError(f"{where} is not a readable .npy array ({err}): write it with "
                        "numpy.save or numpy.savez") from err
    check_dtype(dtype, where)
    return tuple(shape), bool(fortran), dtype


def npz_members(path: Path) -> list[str]:
    """The array names of an .npz (its members without ".npy")."""
    try:
        with zipfile.ZipFile(path) as archive:
            return [n.removesuffix(".npy") for n in archive.namelist() if n.endswith(".npy")]
    except (zipfile.BadZipFile, OSError) as err:
        raise DataError(f"{path} is not a readable .npz ({err}): write it with "
                        "numpy.savez(path, images=..., targets=...)") from err


def open_array(path: Path, member: str | None = None
               ) -> tuple[tuple[int, ...], np.dtype, ArrayFile | None]:
    """(shape, dtype, reader) of the .npy file `path`, or of array `member` of the .npz `path`.
    The reader is None when the array cannot be read by rows (compressed or Fortran order)."""
    where = f"{path}" if member is None else f"{path} [{member}]"
    if member is None:
        with open(path, "rb") as handle:
            shape, fortran, dtype = _header(handle, where)
            offset = handle.tell()
        return shape, dtype, None if fortran else ArrayFile(path, offset, shape, dtype)
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(f"{member}.npy")
        with archive.open(info) as handle:
            shape, fortran, dtype = _header(handle, where)
            header_size = handle.tell()
    if info.compress_type != zipfile.ZIP_STORED or fortran:
        return shape, dtype, None
    with open(path, "rb") as handle:  # the local header's own name and extra lengths
        handle.seek(info.header_offset)
        fields = _LOCAL_HEADER.unpack(handle.read(_LOCAL_HEADER.size))
    if fields[0] != _LOCAL_MAGIC:
        return shape, dtype, None
    start = info.header_offset + _LOCAL_HEADER.size + fields[9] + fields[10]
    return shape, dtype, ArrayFile(path, start + header_size, shape, dtype)
