"""An .npz archive's arrays, read without pickle and checked before anything is allocated.

numpy's own `np.load` trusts each member's .npy header: a damaged header can claim terabytes,
an object dtype, or a shape its bytes do not fill. Here each member is read with zipfile and
`np.lib.format`'s header reader, and the size the header claims (shape x itemsize) must equal
the member's real uncompressed size before its data is read. Big-endian arrays are converted
to native order; object arrays are refused as pickles; non-numeric dtypes (datetime, strings,
complex, records) are refused naming the array.
"""

from __future__ import annotations

import math
import struct
import tokenize
import zipfile
import zlib
from pathlib import Path
from typing import IO

import numpy as np

from vitkit.errors import CheckpointError
from vitkit.weights.formats.base import damaged

# Deflate cannot expand data more than ~1032:1: a member claiming more is damaged.
_MAX_DEFLATE_RATIO = 1032
_NUMERIC_KINDS = "fiub"  # float, signed/unsigned int, bool
_READ_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, OSError,
                NotImplementedError, RuntimeError, struct.error, ValueError, OverflowError)


def read_npz_arrays(path: str | Path) -> dict[str, np.ndarray]:
    """Every array of the .npz at `path`, by name (the member name without '.npy')."""
    path = Path(path)
    try:
        archive = zipfile.ZipFile(path)
    except _READ_ERRORS as exc:
        raise damaged(path, f"not a readable zip archive: {exc}") from None
    with archive:
        archive_size = path.stat().st_size
        arrays: dict[str, np.ndarray] = {}
        for info in archive.infolist():
            name = info.filename.removesuffix(".npy")
            if info.compress_size > archive_size or \
                    info.file_size > _MAX_DEFLATE_RATIO * info.compress_size + 4096:
                raise damaged(path, f"member {info.filename!r} claims {info.file_size} bytes "
                                    f"from {info.compress_size} stored ones")
            try:
                with archive.open(info) as member:
                    arrays[name] = _read_member(member, info, path, name)
            except CheckpointError:
                raise
            except _READ_ERRORS as exc:
                raise damaged(path, f"member {info.filename!r}: {type(exc).__name__}: {exc}") \
                    from None
        return arrays


def _read_member(member: IO[bytes], info: zipfile.ZipInfo, path: Path, name: str
                 ) -> np.ndarray:
    try:
        version = np.lib.format.read_magic(member)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
            np.lib.format.read_array_header_2_0
        shape, fortran_order, dtype = read_header(member)
    except (ValueError, TypeError, SyntaxError, EOFError, struct.error, tokenize.TokenError,
            RecursionError, MemoryError, OverflowError) as exc:
        raise damaged(path, f"the .npy header of {name!r} is unreadable: {exc}") from None
    if dtype.hasobject or dtype.kind not in _NUMERIC_KINDS or dtype.subdtype is not None:
        _drain(member)  # damage (a CRC failure) is reported as such, not as a dtype
    if dtype.hasobject:
        raise CheckpointError(f"{path}: array {name!r} holds pickled Python objects (dtype "
                              f"{dtype}), which are refused because loading them can run code; "
                              "re-save the weights as numeric arrays")
    if dtype.kind not in _NUMERIC_KINDS or dtype.subdtype is not None or dtype.names:
        raise CheckpointError(f"{path}: array {name!r} has dtype {dtype}, which is not a "
                              "number type weights can have; re-save it as float32")
    claimed = math.prod(shape) * dtype.itemsize
    header_size = member.tell()
    actual = info.file_size - header_size
    if claimed != actual:
        raise damaged(path, f"the header of {name!r} claims shape {tuple(shape)} of {dtype} "
                            f"({claimed} bytes) but the member holds {actual} bytes")
    data = member.read(claimed)
    if len(data) != claimed or member.read(1):
        raise damaged(path, f"{name!r} holds {len(data)} bytes, not the {claimed} its size says")
    array = np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran_order else "C")
    return np.array(array, dtype=dtype.newbyteorder("="), order="C")


def _drain(member: IO[bytes], chunk: int = 1 << 20) -> None:
    """Read a member to its end, so that zipfile checks its CRC-32."""
    while member.read(chunk):
        pass
