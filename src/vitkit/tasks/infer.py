"""The task that training targets imply (`infer_task`): (N,) integers are classes, floats are
regression values, (N, K) 0/1 are multi-label when asked; targets that fit no task are
refused, naming the fix."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import torch

from vitkit.errors import ConfigError, DataError, first_few
from vitkit.tasks.spec import TASKS, TaskSpec

log = logging.getLogger("vitkit.tasks")


def infer_task(targets: np.ndarray | torch.Tensor, requested: str | None = None,
               names: Sequence[str] | None = None, where: str = "the targets",
               loss: str | None = None) -> TaskSpec:
    """The task that training targets imply, checked against `requested` (None: inferred).

    (N,) integers -> classification; (N,) or (N, K) floats -> regression; (N, K) of 0/1 ->
    multilabel only when asked (`task=multilabel`). NaN or inf targets are refused, naming
    the first index. Regression specs get the targets' mean and std for standardisation.
    """
    array = targets.numpy() if isinstance(targets, torch.Tensor) else np.asarray(targets)
    if array.ndim not in (1, 2) or len(array) == 0:
        raise DataError(f"{where}: targets must be (N,) or (N, K) with N > 0, got shape "
                        f"{array.shape}")
    if not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
        raise DataError(f"{where}: targets must be numbers, got dtype {array.dtype} (mixed or "
                        "text values in a target column?); convert them to numbers")
    if np.issubdtype(array.dtype, np.floating):
        bad = np.flatnonzero(~np.isfinite(array).reshape(len(array), -1).all(1))
        if len(bad):
            raise DataError(f"{where}: {len(bad)} target(s) are NaN or inf, at index "
                            f"{first_few(bad)}; drop or fix them")
    integral = array.dtype == np.bool_ or np.issubdtype(array.dtype, np.integer) or \
        bool(np.all(array == np.round(array)))
    binary = bool(np.isin(array, (0, 1)).all())
    kind = requested or ("classification" if array.ndim == 1 and
                         (array.dtype == np.bool_ or np.issubdtype(array.dtype, np.integer))
                         else "regression")
    names = list(names) if names is not None else None
    if kind == "classification":
        if array.ndim != 1 or not integral or array.min() < 0:
            raise DataError(f"{where}: task=classification needs (N,) non-negative integer "
                            f"class indices, got {array.dtype} {array.shape}"
                            f"{_class_index_advice(array, integral)}")
        return TaskSpec("classification", names=names, loss=loss)
    if kind == "multilabel":
        if array.ndim != 2 or not binary:
            raise DataError(f"{where}: task=multilabel needs (N, K) targets of 0 and 1, got "
                            f"{array.dtype} {array.shape}"
                            f"{'' if binary else ' with other values'}")
        return TaskSpec("multilabel", names=names, loss=loss)
    if kind != "regression":
        raise ConfigError(f"task={kind!r} is not one of {', '.join(TASKS)}")
    values = array.astype(np.float64).reshape(len(array), -1)
    mean, std = values.mean(0), values.std(0)
    _warn_of_regression_targets(values, std, binary and requested is None, array.ndim, where,
                                names)
    if requested is None and integral and not binary and values.shape[1] == 1 and \
            values.min() >= 0:
        log.info("%s are whole numbers: they train as regression (counts, say); if they are "
                 "class indices: %s", where, _AS_CLASSES)
    std = np.where(std > 0, std, 1.0)
    return TaskSpec("regression", names=names, loss=loss, target_mean=mean.tolist(),
                    target_std=std.tolist())


# arrays and Hugging Face datasets give class indices as integers (tables: as numbers)
_AS_INTEGERS = ("store them as integer class indices, one per image (arrays: targets.reshape(-1)"
                ".astype(np.int64); a Hugging Face column: ds.cast_column(NAME, "
                "datasets.ClassLabel(num_classes=K)))")
_AS_CLASSES = ("in a targets.csv, set task=classification; in arrays or a Hugging Face dataset, "
               + _AS_INTEGERS)


def _class_index_advice(array: np.ndarray, integral: bool) -> str:
    """The fix for targets refused as class indices: whole numbers from 0 held as floats in
    one column are stored as integers; other values are another task's."""
    column = array.ndim == 1 or array.shape[1] == 1
    if column and integral and array.min() >= 0:
        return f"; these are whole numbers from 0 held as floats: {_AS_INTEGERS}"
    return "; use task=regression for real values or task=multilabel for (N, K) 0/1 labels"


def _warn_of_regression_targets(values: np.ndarray, std: np.ndarray, binary: bool, ndim: int,
                                where: str, names: Sequence[str] | None = None) -> None:
    """Say when regression targets look like something else: all 0 and 1 (labels, trained
    as regression unless the task is named), or constant columns (nothing to learn; their
    R^2 is 1 for an exact fit, else 0, as scikit-learn's, and sways the mean)."""
    if binary:
        task = "multi-label classification set task=multilabel" if ndim == 2 else \
            f"two classes: {_AS_CLASSES}"
        log.warning("warning: %s are all 0 or 1: they train as regression; for %s", where, task)
    constant = np.flatnonzero(std == 0)
    if len(values) < 2 or not len(constant):
        return  # one sample (a train_limit of 1) varies in nothing
    named = names is not None and len(names) == values.shape[1]
    if len(constant) == values.shape[1] == 1:
        log.warning("warning: %s%s are all %g: there is nothing to learn (R^2 reads 1 for an "
                    "exact fit, else 0); check the targets file", where,
                    f" (column {names[0]!r})" if named else "", values[0, 0])
        return
    shown = ", ".join(f"{k}{f' {names[k]!r}' if named else ''} (always {values[0, k]:g})"
                      for k in constant[:5]) + (" ..." if len(constant) > 5 else "")
    log.warning("warning: %s: target column(s) %s never change: there is nothing to learn "
                "there and their R^2 reads 1 for an exact fit, else 0; drop them", where, shown)
