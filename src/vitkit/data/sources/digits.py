"""`data=digits`, the embedded default dataset: the 1,797 8x8 handwritten digits that ship
with scikit-learn (UCI optical digits test set, E. Alpaydin and C. Kaynak), stored in the
package as `vitkit/data/digits.npz` (45 KB) so the first training run needs no download."""

from __future__ import annotations

from importlib import resources

import numpy as np
import torch

from vitkit.data.dataset import ImageDataset

DIGIT_CLASSES = [str(d) for d in range(10)]


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
