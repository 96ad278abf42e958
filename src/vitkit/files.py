"""vitkit's own files: the one cache root, and the one way to write a file atomically.

The cache root is `$VITKIT_CACHE`, else `~/.cache/vitkit` (`default_cache`); it holds the
folder indexes (`index/`), frozen features (`features/`) and named checkpoints. The CIFAR
folders default to `~/.cache/vitkit/<dataset>` whatever `$VITKIT_CACHE` says (they have their
own variables, `$VITKIT_CIFAR10_DIR` and `$VITKIT_CIFAR100_DIR`).
An atomic write fills a temporary file `.NAME.XXXX<suffix>` beside the target and renames it
over the target, so a crash leaves the old file or the new one, never a part of one.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

__all__ = ["CACHE_VARIABLE", "JSON_MAX_BYTES", "JSON_MAX_DEPTH", "RELATIVE_FIX", "cache_root",
           "check_json_size", "default_cache", "names_folder", "out_of_room_message",
           "parse_json", "read_json", "relative_data_dir_note", "working_folder", "write_atomic"]

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


# -- vitkit's JSON files ----------------------------------------------------------------------
# Every JSON file vitkit reads (a model config, a weights folder's config.json, a Hugging Face
# config or preprocessor config, a recipe) is read through `read_json`, which refuses what no
# such file holds before it can cost minutes or gigabytes: a file over JSON_MAX_BYTES (checked
# before it is read) or nesting deeper than JSON_MAX_DEPTH (without a RecursionError).
JSON_MAX_BYTES = 16 * 2 ** 20
JSON_MAX_DEPTH = 64


def check_json_size(path: str | Path, error: type[Exception], fix: str) -> None:
    """Refuse a JSON file over JSON_MAX_BYTES before it is read (`error` names the file, the
    limit and `fix`)."""
    size = Path(path).stat().st_size
    if size > JSON_MAX_BYTES:
        raise error(f"{path} is {size:,} bytes, over the {JSON_MAX_BYTES // 2 ** 20} MiB limit "
                    f"of the JSON files vitkit reads: it is not one of them, or is damaged; {fix}")


def parse_json(text: str, source: object, error: type[Exception], fix: str) -> Any:
    """`json.loads(text)`, refusing (as `error`, naming `source` and `fix`) invalid JSON, text
    over JSON_MAX_BYTES and nesting deeper than JSON_MAX_DEPTH."""
    if len(text) > JSON_MAX_BYTES:
        raise error(f"{source} is {len(text):,} characters, over the "
                    f"{JSON_MAX_BYTES // 2 ** 20} MiB limit of vitkit's JSON; {fix}")
    deep = f"{source} nests deeper than {JSON_MAX_DEPTH} levels, the limit of vitkit's JSON: " \
           f"it is not a vitkit file, or is damaged; {fix}"
    try:
        data = json.loads(text)
    except RecursionError:
        raise error(deep) from None
    except json.JSONDecodeError as exc:
        raise error(f"{source} is not valid JSON ({exc}): {fix}") from None
    if json_depth(data) > JSON_MAX_DEPTH:
        raise error(deep)
    return data


def json_depth(data: Any) -> int:
    """How deep lists and objects nest in `data` (0 for a number or string), without recursion."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item \
            if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if depth <= JSON_MAX_DEPTH:
            stack.extend((child, depth + 1) for child in children)
    return deepest


def read_json(path: str | Path, error: type[Exception], fix: str) -> Any:
    """The JSON value in the file `path`, checked as `parse_json` checks text and refused when
    over JSON_MAX_BYTES before it is read or not UTF-8 text (`error`, naming `fix`)."""
    check_json_size(path, error, fix)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path} is not valid JSON (not UTF-8 text: {exc}): {fix}") from None
    return parse_json(text, path, error, fix)


# -- a full disk ------------------------------------------------------------------------------
def out_of_room_message(exc: BaseException, path: str | Path, needed: int | None = None,
                        kept: str = "", fix: str = "free space there, or write it elsewhere"
                        ) -> str | None:
    """One line for a write of `path` that failed because its file system is full (ENOSPC)
    or the quota is spent (EDQUOT): the file, the room left on that file system
    (`shutil.disk_usage`), what the file needs when known (`needed`, bytes), what was kept
    (`kept`, e.g. "the previous last.pt is kept") and `fix`; None for any other error."""
    quota = getattr(errno, "EDQUOT", errno.ENOSPC)  # not on every system
    if not isinstance(exc, OSError) or exc.errno not in (errno.ENOSPC, quota):
        return None

    def size(count: float) -> str:
        for unit in ("bytes", "KB", "MB", "GB"):
            if count < 1000 or unit == "GB":
                return f"{count:.0f} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
            count /= 1000
        return ""

    path = Path(path)
    folder = next((p for p in (path.parent, *path.parents) if p.is_dir()), None)
    try:
        free = f"{size(shutil.disk_usage(folder).free)} free there" if folder else None
    except OSError:
        free = None
    said = ["no space left on device" if exc.errno == errno.ENOSPC else "disk quota exceeded",
            free or "the room left there is unknown"]
    if needed:
        said.append(f"it needs about {size(needed)}")
    return (f"could not write {path}: {'; '.join(said)}" + (f"; {kept}" if kept else "")
            + f". To go on: {fix}")
