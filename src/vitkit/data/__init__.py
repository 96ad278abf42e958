"""Data: in-memory image datasets (CIFAR, image folders, the embedded digits), batching and
batched augmentation on uint8 tensors."""

from vitkit.data.dataset import ImageDataset

__all__ = ["ImageDataset"]
