"""Data: named sources opened by one door (`sources.open_source`), batches for training and
evaluation behind one protocol each (`feeds`), every resize and crop rule (`transforms`),
the one image decoder (`images`) and batched augmentation on uint8 tensors (`augment`)."""

from vitkit.data.dataset import ImageDataset

__all__ = ["ImageDataset"]
