"""numpy or torch arrays in, float64 feature matrices and int64 label vectors out."""

from __future__ import annotations

from typing import Any

import numpy as np

from vitkit.errors import InputError

ArrayLike = Any  # np.ndarray | torch.Tensor | nested lists


def _to_numpy(values: ArrayLike) -> np.ndarray:
    if hasattr(values, "detach"):  # a torch tensor, on any device
        values = values.detach().cpu().numpy()
    return np.asarray(values)


def as_matrix(features: ArrayLike) -> np.ndarray:
    """(N, D) float64."""
    x = _to_numpy(features).astype(np.float64, copy=False)
    if x.ndim != 2:
        raise InputError(f"features must be a 2-D (images, dims) array, got shape {x.shape}: "
                         "flatten each image's representation to one row")
    return x


def as_labels(labels: ArrayLike) -> np.ndarray:
    """(N,) int64 class indices >= 0."""
    y = _to_numpy(labels)
    if y.ndim != 1:
        raise InputError(f"labels must be a 1-D array of class indices, got shape {y.shape}")
    y = y.astype(np.int64, copy=False)
    if len(y) and y.min() < 0:
        raise InputError(f"labels must be class indices >= 0, got {y.min()}: unlabelled images "
                         "(label -1) cannot be used for evaluation")
    return y


def standardize(train: np.ndarray, *others: np.ndarray, epsilon: float = 1e-5
                ) -> list[np.ndarray]:
    """Every array standardised with the training array's mean and (population) std."""
    mean, std = train.mean(axis=0), train.std(axis=0) + epsilon
    return [(x - mean) / std for x in (train, *others)]
