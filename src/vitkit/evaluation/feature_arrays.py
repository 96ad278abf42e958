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
    """(N, D) finite float64."""
    x = _to_numpy(features).astype(np.float64, copy=False)
    if x.ndim != 2:
        raise InputError(f"features must be a 2-D (images, dims) array, got shape {x.shape}: "
                         "flatten each image's representation to one row")
    bad = ~np.isfinite(x).all(axis=1)
    if bad.any():
        raise InputError(f"{int(bad.sum())} of the {len(x)} feature rows hold inf or NaN (row "
                         f"{int(np.flatnonzero(bad)[0])} first): the model's outputs overflow "
                         "there; drop those rows or fix the weights or inputs")
    return x


def as_labels(labels: ArrayLike) -> np.ndarray:
    """(N,) int64 class indices >= 0 (whole numbers: 1.7 is refused, not truncated)."""
    y = _to_numpy(labels)
    if y.ndim != 1:
        raise InputError(f"labels must be a 1-D array of class indices, got shape {y.shape}")
    if y.dtype.kind == "f" and len(y) and not np.array_equal(y, np.round(y)):
        raise InputError(f"labels must be whole class indices, got {y[y != np.round(y)][0]}: "
                         "class labels are 0, 1, 2, ... (regression targets are for "
                         "vitkit.evaluation.ridge_probe)")
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


def classification_split(x_train: ArrayLike, y_train: ArrayLike, x_test: ArrayLike,
                         y_test: ArrayLike, num_classes: int
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The four arrays of a frozen-feature classification protocol, checked together: one
    label per feature row, the same feature width in both splits, labels below
    `num_classes`."""
    x_train, x_test = as_matrix(x_train), as_matrix(x_test)
    y_train, y_test = as_labels(y_train), as_labels(y_test)
    for split, x, y in (("training", x_train, y_train), ("test", x_test, y_test)):
        if len(x) != len(y):
            raise InputError(f"{len(x)} {split} features but {len(y)} {split} labels: pass one "
                             "label per feature row")
    if x_train.shape[1] != x_test.shape[1]:
        raise InputError(f"the training features have {x_train.shape[1]} dims and the test "
                         f"features {x_test.shape[1]}: extract both with the same model")
    top = max(y_train.max(initial=-1), y_test.max(initial=-1))
    if top >= num_classes:
        raise InputError(f"a label is {top} but num_classes is {num_classes}: pass "
                         f"num_classes={top + 1} (or more)")
    return x_train, y_train, x_test, y_test

