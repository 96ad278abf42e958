"""`data=cifar10` / `data=cifar100`: CIFAR-10 and CIFAR-100 in the official binary format,
read with numpy into an `ImageDataset`.

Layouts (one folder per dataset, as the official tarballs extract):

* `cifar-10-batches-bin/`: `data_batch_1..5.bin` (train), `test_batch.bin` (test),
  `batches.meta.txt`; records of 1 label byte + 3072 pixel bytes.
* `cifar-100-binary/`: `train.bin`, `test.bin`, `fine_label_names.txt`; records of
  2 label bytes (coarse, fine) + 3072 pixel bytes. The fine label is used.

Pixels are stored as a red, a green and a blue 32x32 plane, each row-major: exactly CHW.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

import numpy as np
import torch

from vitkit.data.dataset import DataError, ImageDataset
from vitkit.files import RELATIVE_FIX, default_cache, relative_data_dir_note

__all__ = [
    "CIFAR_SPECS",
    "CifarSpec",
    "download_cifar",
    "find_cifar_dir",
    "load_cifar",
    "open_cifar",
    "verify_and_extract",
]

logger = logging.getLogger("vitkit.data")

IMAGE_SHAPE = (3, 32, 32)
PIXEL_BYTES = 3 * 32 * 32
_MAX_META_BYTES = 1 << 16  # the official name lists are under 1 KB


@dataclass(frozen=True)
class CifarSpec:
    """Where one CIFAR variant's files live and how its records are laid out."""

    name: str
    folder: str
    train_files: tuple[str, ...]
    test_files: tuple[str, ...]
    label_bytes: int
    label_index: int
    num_classes: int
    meta_file: str
    env_var: str
    url: str
    md5: str

    @property
    def record_bytes(self) -> int:
        return self.label_bytes + PIXEL_BYTES

    def files(self, split: str) -> tuple[str, ...]:
        return self.train_files if split == "train" else self.test_files


CIFAR_SPECS: dict[str, CifarSpec] = {
    "cifar10": CifarSpec(
        name="cifar10",
        folder="cifar-10-batches-bin",
        train_files=tuple(f"data_batch_{i}.bin" for i in range(1, 6)),
        test_files=("test_batch.bin",),
        label_bytes=1,
        label_index=0,
        num_classes=10,
        meta_file="batches.meta.txt",
        env_var="VITKIT_CIFAR10_DIR",
        url="https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",
        md5="c32a1d4ab5d03f1284b67883e8d87530",
    ),
    "cifar100": CifarSpec(
        name="cifar100",
        folder="cifar-100-binary",
        train_files=("train.bin",),
        test_files=("test.bin",),
        label_bytes=2,
        label_index=1,
        num_classes=100,
        meta_file="fine_label_names.txt",
        env_var="VITKIT_CIFAR100_DIR",
        url="https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz",
        md5="03b5dce01913d631647c71ecec9e9cb8",
    ),
}


def _spec(dataset: str) -> CifarSpec:
    try:
        return CIFAR_SPECS[dataset]
    except KeyError:
        raise DataError(f"unknown CIFAR dataset {dataset!r}; use one of "
                        f"{', '.join(sorted(CIFAR_SPECS))}") from None


def _default_root(dataset: str) -> Path:
    return default_cache() / dataset


def _looks_like_data_dir(path: Path, spec: CifarSpec) -> bool:
    names = (spec.meta_file, *spec.train_files, *spec.test_files)
    return path.is_dir() and any((path / name).is_file() for name in names)


def _resolve(root: Path, spec: CifarSpec) -> Path | None:
    """`root/<folder>` or `root` itself, whichever holds the CIFAR files; None if neither."""
    for candidate in (root / spec.folder, root):
        if _looks_like_data_dir(candidate, spec):
            return candidate
    return None


def _not_found(spec: CifarSpec, looked: list[Path]) -> DataError:
    where = "; ".join(str(p) for p in looked)
    note = relative_data_dir_note(looked[0], fix=False)
    return DataError(
        f"{spec.name} data not found (looked in: {where}){note}. "
        f"Expected the folder {spec.folder}/ (from the official binary tarball) or a folder "
        f"containing it. Fix: {RELATIVE_FIX if note else 'pass --data-dir PATH'}, "
        f"or set the environment variable {spec.env_var}=PATH, or fetch it with "
        f"vitkit.data.sources.cifar.download_cifar({spec.name!r}, "
        f"{str(_default_root(spec.name))!r})."
    )


def find_cifar_dir(dataset: str, data_dir: str | Path | None = None) -> Path:
    """The folder holding `dataset`'s binary files.

    Looks in `data_dir` if given, else in `$VITKIT_CIFAR10_DIR` / `$VITKIT_CIFAR100_DIR` if
    set, else in `~/.cache/vitkit/<dataset>` (`vitkit.files.default_cache`); each may be the
    data folder or its parent.
    """
    spec = _spec(dataset)
    if data_dir is not None:
        root = Path(data_dir).expanduser()
    elif os.environ.get(spec.env_var):
        root = Path(os.environ[spec.env_var]).expanduser()
    else:
        root = _default_root(dataset)
    found = _resolve(root, spec)
    if found is None:
        raise _not_found(spec, [root, root / spec.folder])
    return found


def _bad_meta(path: Path, spec: CifarSpec, problem: str) -> DataError:
    return DataError(f"{path} {problem}; it should list the {spec.num_classes} {spec.name} class "
                     f"names, one per line. Restore it from the official {spec.name} tarball, or "
                     f"delete it to name the classes 0..{spec.num_classes - 1}.")


def _read_class_names(folder: Path, spec: CifarSpec) -> list[str]:
    path = folder / spec.meta_file
    if not path.is_file():
        logger.warning("%s: %s missing; naming the classes 0..%d", folder, spec.meta_file,
                       spec.num_classes - 1)
        return [str(i) for i in range(spec.num_classes)]
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise _bad_meta(path, spec, f"cannot be read ({err.strerror})") from err
    if len(raw) > _MAX_META_BYTES:
        raise _bad_meta(path, spec, f"has {len(raw):,} bytes, too many for a list of class "
                                    f"names")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise _bad_meta(path, spec, f"is not UTF-8 text (byte {err.start}: {err.reason})"
                        ) from err
    names = [n for n in (line.strip() for line in text.split("\n")) if n]
    odd = next((n for n in names if not n.isprintable()), None)
    if odd is not None:
        raise _bad_meta(path, spec, f"has a control character in the name {odd!r}")
    if len(names) != spec.num_classes:
        raise _bad_meta(path, spec, f"lists {len(names)} class names but {spec.name} has "
                                    f"{spec.num_classes} (is it the file for --data "
                                    f"{spec.name}?)")
    return names


def _read_records(path: Path, count: int, record_bytes: int) -> np.ndarray:
    """The first `count` records of `path` as a (count, record_bytes) uint8 array."""
    try:
        data = np.fromfile(path, dtype=np.uint8, count=count * record_bytes)
    except OSError as err:
        raise DataError(f"cannot read {path} ({err.strerror or err}); check the file's "
                        f"permissions, or re-extract the official tarball") from err
    if data.size != count * record_bytes:
        raise DataError(f"{path} ended after {data.size:,} bytes while reading {count} records "
                        f"(it changed while being read?); re-extract the official tarball")
    return data.reshape(count, record_bytes)


def load_cifar(
    root: str | Path,
    split: Literal["train", "test"],
    dataset: Literal["cifar10", "cifar100"] = "cifar10",
    limit: int | None = None,
) -> ImageDataset:
    """Read the `split` records of CIFAR-10/100 under `root` (the data folder or its parent).

    `limit` keeps only the first `limit` records (in file order), reading no more than needed.
    """
    spec = _spec(dataset)
    if split not in ("train", "test"):
        raise DataError(f"unknown split {split!r}; use 'train' or 'test'")
    if limit is not None and limit < 0:
        raise DataError(f"limit must be >= 0 (or None for all records), got {limit}")
    root = Path(root).expanduser()
    folder = _resolve(root, spec)
    if folder is None:
        raise _not_found(spec, [root, root / spec.folder])

    rec = spec.record_bytes
    counts: list[tuple[Path, int]] = []
    for name in spec.files(split):
        path = folder / name
        if not path.is_file():
            raise DataError(f"{spec.name} {split} file {path} is missing; the folder {folder} is "
                            f"incomplete. Re-extract the official {spec.name} binary tarball "
                            f"there (or delete the folder and run download_cifar).")
        size = path.stat().st_size
        if size == 0 or size % rec:
            raise DataError(f"{path} has {size:,} bytes, not a multiple of the {rec}-byte "
                            f"{spec.name} record (expected e.g. {10000 * rec:,} bytes for 10,000 "
                            f"records): the file is truncated or not a {spec.name} binary batch. "
                            f"Re-download or re-extract it.")
        counts.append((path, size // rec))

    total = sum(n for _, n in counts)
    wanted = total if limit is None else min(limit, total)
    images = np.empty((wanted, PIXEL_BYTES), dtype=np.uint8)
    labels = np.empty(wanted, dtype=np.int64)
    filled = 0
    for path, n in counts:
        take = min(n, wanted - filled)
        if take <= 0:
            break
        records = _read_records(path, take, rec)
        file_labels = records[:, spec.label_index]
        bad = np.flatnonzero(file_labels >= spec.num_classes)
        if bad.size:
            raise DataError(f"{path}: record {int(bad[0])} has label {int(file_labels[bad[0]])}, "
                            f"but {spec.name} labels are 0..{spec.num_classes - 1} "
                            f"({bad.size} bad records). The file is corrupt or belongs to another "
                            f"dataset (check `data=` / --data).")
        labels[filled:filled + take] = file_labels
        images[filled:filled + take] = records[:, spec.label_bytes:]
        filled += take

    return ImageDataset(
        images=torch.from_numpy(images.reshape(wanted, *IMAGE_SHAPE)),
        labels=torch.from_numpy(labels),
        classes=_read_class_names(folder, spec),
        name=f"{spec.name}-{split}",
    )


def open_cifar(dataset: str, data_dir: str | Path | None = None, train_limit: int | None = None,
               test_limit: int | None = None) -> tuple[ImageDataset, ImageDataset]:
    """The training and test split of `dataset` (found by `find_cifar_dir`), each cut to its
    first `*_limit` records when given."""
    root = find_cifar_dir(dataset, data_dir)
    return (load_cifar(root, "train", dataset, limit=train_limit),  # type: ignore[arg-type]
            load_cifar(root, "test", dataset, limit=test_limit))  # type: ignore[arg-type]


def _md5(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _check_member(member: tarfile.TarInfo, archive: Path) -> None:
    name = member.name
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":") or ".." in parts:
        raise DataError(f"refusing to extract {archive}: member {name!r} has an absolute path or "
                        f"'..' and would be written outside the target folder. The archive is not "
                        f"an official CIFAR tarball; delete it and download again.")
    if not (member.isfile() or member.isdir()):
        raise DataError(f"refusing to extract {archive}: member {name!r} is a link or special "
                        f"file, which the official CIFAR tarballs never contain; delete the "
                        f"archive and download again.")


def verify_and_extract(archive: str | Path, md5: str | None, dest: str | Path) -> list[Path]:
    """Check `archive`'s md5 (unless None), extract it safely into `dest`, return the new entries.

    Members are first extracted into a temporary folder inside `dest`; each top-level entry is
    then renamed into place atomically, so `dest` never holds a half-extracted dataset.
    """
    archive, dest = Path(archive), Path(dest)
    if md5 is not None:
        got = _md5(archive)
        if got != md5.lower():
            raise DataError(f"checksum mismatch for {archive}: expected md5 {md5}, got {got}. The "
                            f"download is corrupt or incomplete; delete it and download again.")
    dest.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".extract-", dir=dest))
    try:
        try:
            with tarfile.open(archive, "r:*") as tar:
                members = tar.getmembers()
                for member in members:
                    _check_member(member, archive)
                if hasattr(tarfile, "data_filter"):
                    tar.extractall(staging, members=members, filter="data")
                else:  # pragma: no cover - Python without extraction filters
                    tar.extractall(staging, members=members)  # members checked above
        except (tarfile.TarError, EOFError, OSError) as err:
            raise DataError(f"cannot extract {archive}: {err}. The archive is damaged; delete it "
                            f"and download again.") from err
        moved = []
        for entry in sorted(staging.iterdir()):
            target = dest / entry.name
            if target.exists():
                raise DataError(f"{target} already exists; remove it (or extract elsewhere) "
                                f"before extracting {archive} again.")
            os.replace(entry, target)
            moved.append(target)
        return moved
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def download_cifar(
    dataset: Literal["cifar10", "cifar100"],
    root: str | Path,
    *,
    url: str | None = None,
    md5: str | None = None,
    timeout: float = 60.0,
) -> Path:
    """Download the official binary tarball into `root`, verify, extract; return the data folder.

    Does nothing if the data is already there. `url` / `md5` override the official ones
    (a mirror, or a local `file://` URL).
    """
    spec = _spec(dataset)
    root = Path(root).expanduser()
    found = _resolve(root, spec)
    if found is not None:
        return found
    url = url or spec.url
    md5 = md5 or spec.md5
    root.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{spec.name}-", suffix=".tar.gz.part", dir=root)
    tmp = Path(tmp_name)
    try:
        logger.info("downloading %s from %s", spec.name, url)
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as resp:
                shutil.copyfileobj(resp, out, length=1 << 20)
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as err:
            raise DataError(
                f"could not download {spec.name} from {url}: {err}. Without internet, fetch "
                f"{spec.url} elsewhere, extract it into {root} (giving {root / spec.folder}) and "
                f"pass --data-dir {root} or set {spec.env_var}."
            ) from err
        verify_and_extract(tmp, md5, root)
    finally:
        tmp.unlink(missing_ok=True)
    found = _resolve(root, spec)
    if found is None:
        raise DataError(f"the archive from {url} did not contain {spec.folder}/ with the "
                        f"{spec.name} files; check the url.")
    return found
