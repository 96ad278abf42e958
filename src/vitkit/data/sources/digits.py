"""`data=digits`, the embedded default dataset: the 1,797 8x8 handwritten digits that ship
with scikit-learn (UCI optical digits test set, E. Alpaydin and C. Kaynak), stored in the
package as `vitkit/data/digits.npz` (45 KB) so the first training run needs no download.

The digits are light strokes on a black background, each filling its 8x8 frame; a model
trained on them misreads a digit drawn the usual way (dark on light). `sample_digit()` is one
of them as a file (`vitkit predict runs/digits --sample`), `looks_inverted` spots the other
kind, and `INPUT_NOTE` / `INVERTED_WARNING` say what a digits model expects.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np
import torch

from vitkit.data.dataset import ImageDataset

DIGIT_CLASSES = [str(d) for d in range(10)]
SAMPLE_INDEX = 36  # of the held-out split (`load_digits("test")`): a 3
INPUT_NOTE = ("a digits model reads light strokes on a black background, the digit filling "
              "the 8x8 frame, as in the embedded set it was trained on")
INVERTED_WARNING = ("the digits model expects light strokes on a black background; invert the "
                    "image (e.g. PIL.ImageOps.invert)")


def sample_digit() -> Path:
    """The shipped sample, `vitkit/data/samples/digit_3.png`: held-out digit SAMPLE_INDEX (a 3)
    as an 8x8 gray PNG, light strokes on black, as a digits model expects its input."""
    return Path(str(resources.files("vitkit.data").joinpath("samples").joinpath("digit_3.png")))


def looks_inverted(image: torch.Tensor) -> bool:
    """True when a uint8 image is brighter than mid-gray on average: dark strokes on a light
    background. (Every embedded digit averages 46 to 108 of 255; inverted, 147 to 209.)"""
    return image.float().mean().item() > 127.5


def load_digits(split: str = "train", test_fraction: float = 0.2, seed: int = 0) -> ImageDataset:
    """Digits as uint8 (N, 1, 8, 8) images scaled to 0-255; a fixed stratified held-out split.

    The split is the same for every call with the same `test_fraction` and `seed`.
    """
    with resources.files("vitkit.data").joinpath("digits.npz").open("rb") as handle:
        archive = np.load(handle)
        images, labels = archive["images"], archive["labels"]
    images = torch.from_numpy((images.astype(np.float32) * (255 / 16)).round().astype(np.uint8))
    labels = torch.from_numpy(labels.astype(np.int64))
    generator = torch.Generator().manual_seed(seed)
    test_mask = torch.zeros(len(labels), dtype=torch.bool)
    for digit in range(10):  # stratified: the same fraction of every class is held out
        members = torch.nonzero(labels == digit).flatten()
        members = members[torch.randperm(len(members), generator=generator)]
        test_mask[members[: round(len(members) * test_fraction)]] = True
    mask = test_mask if split == "test" else ~test_mask
    return ImageDataset(images[mask][:, None], labels[mask], DIGIT_CLASSES, name=f"digits-{split}")


def open_digits(train_limit: int | None = None, test_limit: int | None = None
                ) -> tuple[ImageDataset, ImageDataset]:
    """The training and held-out digits, each cut to its first `*_limit` images when given."""
    train, test = load_digits("train"), load_digits("test")
    if train_limit:
        train = train.subset(slice(0, train_limit))
    if test_limit:
        test = test.subset(slice(0, test_limit))
    return train, test
