"""vitkit's own files: the one cache root, and the one way to write a file atomically.

The cache root is `$VITKIT_CACHE`, else `~/.cache/vitkit` (`default_cache`); it holds the
folder indexes (`index/`), frozen features (`features/`) and named checkpoints. The CIFAR
folders default to `~/.cache/vitkit/<dataset>` whatever `$VITKIT_CACHE` says (they have their
own variables, `$VITKIT_CIFAR10_DIR` and `$VITKIT_CIFAR100_DIR`).
An atomic write fills a temporary file `.NAME.XXXX<suffix>` beside the target and renames it
over the target, so a crash leaves the old file or the new one, never a part of one.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["CACHE_VARIABLE", "RELATIVE_FIX", "cache_root", "default_cache", "names_folder",
           "relative_data_dir_note", "working_folder", "write_atomic"]

CACHE_VARIABLE = "VITKIT_CACHE"


def default_cache() -> Path:
    """`~/.cache/vitkit` (the home folder read at call time)."""
    return Path.home() / ".cache" / "vitkit"


def cache_root() -> Path:
    """`$VITKIT_CACHE`, else `default_cache()` (read at call time)."""
    base = os.environ.get(CACHE_VARIABLE)
    return Path(base) if base else default_cache()


def names_folder(text: str | Path) -> bool:
    """Whether the path `text` can only be a folder: it ends in a separator ("runs/"; either
    separator on Windows), or its last part is "." or ".." (`Path` drops a trailing slash, so
    ask before making one)."""
    return os.path.basename(str(text)) in ("", ".", "..")


RELATIVE_FIX = ("run from the folder it is relative to, or pass its full path: --data-dir PATH; "
                "train also takes data_dir=PATH")


def relative_data_dir_note(path: str | Path, fix: bool = True) -> str:
    """For a message about a path that was not found: where a relative one was looked for
    (the working folder), and the fix (`RELATIVE_FIX`, unless `fix` is false because the
    message gives it itself); "" for an absolute path."""
    if Path(path).expanduser().is_absolute():
        return ""
    return (f" (a relative path, looked for in the working folder {Path.cwd()}"
            + (f": {RELATIVE_FIX})" if fix else ")"))


def working_folder() -> str | None:
    """The absolute working folder, or None when it has gone (deleted under the process)."""
    try:
        return os.getcwd()
    except OSError:
        return None


def write_atomic(path: str | Path, write: Callable[[BinaryIO], object], suffix: str = ".tmp",
                 fsync: bool = False) -> Path:
    """Write `path` through `write(stream)` (a binary file open for writing) without ever
    leaving a partial file: the temporary file beside it replaces `path` once `write` returns
    (after an fsync when `fsync`), and is removed when anything fails."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            write(stream)
            if fsync:
                stream.flush()
                os.fsync(stream.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
