"""Named data sources -> (train, test) datasets: the embedded digits, CIFAR, image folders."""

from __future__ import annotations

from pathlib import Path

from vitkit.data.dataset import DataError, ImageDataset

SOURCES = ("digits", "cifar10", "cifar100", "folder")


def load_source(name: str, data_dir: str | None = None, image_size: tuple[int, int] | None = None,
                channels: int = 3, train_limit: int | None = None,
                test_limit: int | None = None) -> tuple[ImageDataset, ImageDataset]:
    """Train and test splits of a data source.

    "folder" reads `data_dir/train/<class>/*` and `data_dir/val/<class>/*` (or `test/`).
    """
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

        if data_dir is None:
            raise DataError("data='folder' needs data_dir=PATH holding train/ and val/ (or "
                            "test/) folders with one subfolder per class")
        root = Path(data_dir)
        held_out = next((root / sub for sub in ("val", "test") if (root / sub).is_dir()), None)
        if not (root / "train").is_dir() or held_out is None:
            raise DataError(f"{root} must hold train/ and val/ (or test/) folders, each with one "
                            "subfolder per class")
        train = load_image_folder(root / "train", image_size, channels)
        test = load_image_folder(held_out, image_size, channels)
        if train.classes != test.classes:
            raise DataError(f"train classes {train.classes[:5]}... differ from held-out classes "
                            f"{test.classes[:5]}...: both folders need the same class subfolders")
    else:
        raise DataError(f"unknown data source {name!r}: use one of {', '.join(SOURCES)}")
    if train_limit:
        train = train.subset(slice(0, train_limit))
    if test_limit:
        test = test.subset(slice(0, test_limit))
    return train, test
