"""`data=arrays`: scientific arrays from `.npz` files, the source for fields, spectrograms and
measurements rather than 8-bit pictures.

`data_dir/train.npz` and `data_dir/test.npz` (else `val.npz`), each with the keys `images`
((N, H, W) or (N, C, H, W), any numeric dtype) and `targets` ((N,) integers: classes; (N,) or
(N, K) floats: regression; (N, K) 0/1: multi-label with task=multilabel). Images are held as
float32 in their own units; the run normalises them with the training set's per-channel mean
and std (`Preprocess.scale` = 1), never assuming 0-255.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from vitkit.data.dataset import ImageDataset
from vitkit.errors import DataError

__all__ = ["ARRAY_KEYS", "open_arrays"]

ARRAY_KEYS = ("images", "targets")
HELD_OUT = ("test", "val")


def _split_file(folder: Path, names: tuple[str, ...]) -> Path:
    for name in names:
        path = folder / f"{name}.npz"
        if path.is_file():
            return path
    wanted = " or ".join(f"{folder / n}.npz" for n in names)
    raise DataError(f"data=arrays: no {wanted}; write it with numpy.savez(path, images=..., "
                    "targets=...)")


def _read(path: Path) -> ImageDataset:
    with np.load(path, allow_pickle=False) as archive:
        missing = [k for k in ARRAY_KEYS if k not in archive.files]
        if missing:
            raise DataError(f"{path} has no {', '.join(missing)} (it holds "
                            f"{', '.join(archive.files) or 'nothing'}): save the arrays as "
                            "numpy.savez(path, images=..., targets=...)")
        images, targets = archive["images"], archive["targets"]
    if images.ndim == 3:
        images = images[:, None]
    if images.ndim != 4:
        raise DataError(f"{path}: images must be (N, H, W) or (N, C, H, W), got {images.shape}")
    if len(targets) != len(images):
        raise DataError(f"{path}: {len(images)} images but {len(targets)} targets")
    tensor_targets = torch.from_numpy(np.ascontiguousarray(targets))
    if not np.issubdtype(targets.dtype, np.integer):
        tensor_targets = tensor_targets.float()
    return ImageDataset(torch.from_numpy(images.astype(np.float32)), tensor_targets, [],
                        name=f"arrays:{path.stem}")


def open_arrays(data_dir: str | None, train_limit: int | None = None,
                test_limit: int | None = None) -> tuple[ImageDataset, ImageDataset]:
    """The training and held-out arrays of `data_dir`, cut to their first `*_limit` records."""
    if not data_dir:
        raise DataError("data=arrays needs data_dir=DIR holding train.npz and test.npz")
    folder = Path(data_dir).expanduser()
    if not folder.is_dir():
        raise DataError(f"data=arrays: the folder {folder} does not exist; pass "
                        "data_dir=DIR holding train.npz and test.npz")
    train = _read(_split_file(folder, ("train",)))
    test = _read(_split_file(folder, HELD_OUT))
    if train_limit:
        train = train.subset(slice(0, train_limit))
    if test_limit:
        test = test.subset(slice(0, test_limit))
    return train, test
