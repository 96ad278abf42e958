"""Linear probe: multinomial logistic regression on standardised frozen features.

The loss is mean cross-entropy + (weight_decay / 2) * ||W||^2 (the bias unpenalised),
minimised full-batch by L-BFGS in float64. This is scikit-learn's LogisticRegression with
C = 1 / (weight_decay * N) (it minimises C * sum of cross-entropies + ||W||^2 / 2). The weight
decay is chosen on a stratified, seeded 10% of the training split held out, from a log-spaced
grid; the probe is then refitted on the whole training split and scored on the test split.

Regression targets get ridge regression instead (`ridge_probe`: closed form, scikit-learn's
`Ridge`, alpha chosen on a random held-out 10% by R^2, scored with R^2, MAE and RMSE);
multi-label targets a one-vs-rest logistic regression (`multilabel_probe`, weight decay chosen
by mAP, scored with mAP and F1).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from vitkit.errors import InputError
from vitkit.evaluation.feature_arrays import (
    ArrayLike,
    as_labels,
    as_matrix,
    classification_split,
    standardize,
)
from vitkit.runtime import set_threads

WEIGHT_DECAYS = tuple(float(v) for v in np.logspace(-5, 0, 6))  # 1e-5 ... 1
HOLDOUT_FRACTION = 0.1
SINGLE_THREAD_WORK = 2**24  # below this many multiply-adds per pass, threads cost more than help
MAX_ITER = 10000  # L-BFGS iterations; 1024 CIFAR-10 features take scikit-learn thousands
TOLERANCE = 1e-9  # the largest gradient element at which L-BFGS stops
UNCONVERGED_GRADIENT = 1e-6  # at the cap, a larger gradient element is warned about

log = logging.getLogger("vitkit.evaluation")


@contextmanager
def _threads_for(work: int) -> Iterator[None]:
    """One torch thread for small problems (thread hand-offs dominate a tiny matmul, badly so
    on a busy machine), restored afterwards; the current count, untouched, otherwise (setting
    even the same count turns MKL's dynamic threading off: `vitkit.runtime.set_threads`)."""
    if work >= SINGLE_THREAD_WORK:
        yield
        return
    before = torch.get_num_threads()
    set_threads(1)
    try:
        yield
    finally:
        set_threads(before)


@dataclass(frozen=True)
class LogisticProbe:
    """A fitted linear classifier on standardised features: logits = x @ weight + bias."""

    weight: np.ndarray  # (D, C)
    bias: np.ndarray  # (C,)
    iterations: int

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.argmax(x @ self.weight + self.bias, axis=1)


def _fit_linear_lbfgs(features: torch.Tensor, targets: torch.Tensor, outputs: int,
                      loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                      weight_decay: float, max_iter: int, tolerance: float) -> LogisticProbe:
    """Minimise loss_of(x @ W + b, targets) + weight_decay / 2 * ||W||^2 with full-batch
    L-BFGS (strong Wolfe line search), from zero weights; a warning if it stops at the cap."""
    weight = torch.zeros(features.shape[1], outputs, dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(outputs, dtype=torch.float64, requires_grad=True)
    max_eval = 2 * max_iter
    optimizer = torch.optim.LBFGS([weight, bias], lr=1.0, max_iter=max_iter, max_eval=max_eval,
                                  history_size=20, tolerance_grad=tolerance,
                                  tolerance_change=1e-14, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = loss_of(features @ weight + bias, targets) \
            + 0.5 * weight_decay * weight.pow(2).sum()
        loss.backward()
        return loss

    with _threads_for(features.numel() * outputs):
        optimizer.step(closure)
    state = optimizer.state[weight]
    iterations = int(state.get("n_iter", 0))
    if iterations >= max_iter or state.get("func_evals", 0) >= max_eval:
        _warn_at_cap(closure, weight, bias, weight_decay, max_iter, tolerance)
    return LogisticProbe(weight.detach().numpy(), bias.detach().numpy(), iterations)


def _warn_at_cap(closure: Callable[[], torch.Tensor], weight: torch.Tensor, bias: torch.Tensor,
                 weight_decay: float, max_iter: int, tolerance: float) -> None:
    """Warn (as scikit-learn's ConvergenceWarning) that L-BFGS stopped at its cap, unless the
    largest gradient element it stopped at is within `UNCONVERGED_GRADIENT` (on CIFAR-10
    features, a largest element of 2e-7 leaves the objective within 3e-8 of scikit-learn's
    converged one)."""
    with torch.enable_grad():
        closure()
    gradient = max(float(weight.grad.abs().max()), float(bias.grad.abs().max()))
    if gradient <= max(tolerance, UNCONVERGED_GRADIENT):
        return
    log.warning("warning: the linear probe's L-BFGS stopped at its cap of %d iterations "
                "before converging (weight decay %g: largest gradient %.3g > %g); "
                "its accuracy may be slightly off: pass a larger max_iter "
                "(vitkit.evaluation.fit_logistic / linear_probe) or use a larger weight decay",
                max_iter, weight_decay, gradient, max(tolerance, UNCONVERGED_GRADIENT))


def fit_logistic(x: ArrayLike, y: ArrayLike, num_classes: int, weight_decay: float,
                 max_iter: int = MAX_ITER, tolerance: float = TOLERANCE) -> LogisticProbe:
    """Minimise mean cross-entropy + weight_decay / 2 * ||W||^2 with full-batch L-BFGS."""
    return _fit_linear_lbfgs(torch.from_numpy(as_matrix(x)), torch.from_numpy(as_labels(y)),
                             num_classes, F.cross_entropy, weight_decay, max_iter, tolerance)


def stratified_holdout(labels: np.ndarray, fraction: float, seed: int
                       ) -> tuple[np.ndarray, np.ndarray]:
    """(fit indices, held-out indices): `fraction` of each class held out (at least one image
    of a class with two or more), drawn with numpy Generator(seed)."""
    rng = np.random.default_rng(seed)
    fit, held = [], []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        count = min(max(1, round(fraction * len(idx))), len(idx) - 1)
        held.append(idx[:count])
        fit.append(idx[count:])
    return np.sort(np.concatenate(fit)), np.sort(np.concatenate(held))


@dataclass(frozen=True)
class ProbeResult:
    accuracy: float
    weight_decay: float
    heldout_accuracy: dict[float, float]  # grid value -> accuracy on the held-out 10%
    predictions: np.ndarray

    def as_dict(self) -> dict[str, object]:
        return {"accuracy": self.accuracy, "weight_decay": self.weight_decay,
                "heldout_accuracy": {f"{wd:g}": acc for wd, acc in
                                     self.heldout_accuracy.items()}}


def linear_probe(x_train: ArrayLike, y_train: ArrayLike, x_test: ArrayLike, y_test: ArrayLike,
                 num_classes: int, weight_decays: tuple[float, ...] = WEIGHT_DECAYS,
                 seed: int = 0, max_iter: int = MAX_ITER) -> ProbeResult:
    """Pick the weight decay on a held-out 10% (ties: the larger decay), refit on the whole
    training split, score on the test split. Features are standardised with the statistics of
    the split each probe is fitted on."""
    x_train, y_train, x_test, y_test = classification_split(x_train, y_train, x_test, y_test,
                                                            num_classes)
    if np.bincount(y_train).max(initial=0) < 2:
        raise InputError("the linear probe needs at least two training images of some class "
                         "to hold one out for choosing the weight decay: use more training data")
    fit, held = stratified_holdout(y_train, HOLDOUT_FRACTION, seed)
    x_fit, x_held = standardize(x_train[fit], x_train[held])
    heldout = {}
    for wd in weight_decays:
        probe = fit_logistic(x_fit, y_train[fit], num_classes, wd, max_iter)
        heldout[wd] = float(np.mean(probe.predict(x_held) == y_train[held]))
    best = max(sorted(weight_decays, reverse=True), key=lambda wd: heldout[wd])
    x_all, x_eval = standardize(x_train, x_test)
    predictions = fit_logistic(x_all, y_train, num_classes, best, max_iter).predict(x_eval)
    return ProbeResult(float(np.mean(predictions == y_test)), best, heldout, predictions)


# -- regression and multi-label targets -----------------------------------------------------------
RIDGE_ALPHAS = tuple(float(v) for v in np.logspace(-3, 5, 9))  # 1e-3 ... 1e5
MIN_TRAIN_FOR_HOLDOUT = 10


@dataclass(frozen=True)
class RidgeProbe:
    """A fitted ridge regression: predictions = x @ weight + bias (scikit-learn's `Ridge`
    with an intercept: the centred least squares + alpha * ||W||^2, bias unpenalised)."""

    weight: np.ndarray  # (D, K)
    bias: np.ndarray  # (K,)

    def predict(self, x: np.ndarray) -> np.ndarray:
        return x @ self.weight + self.bias


def fit_ridge(x: ArrayLike, y: ArrayLike, alpha: float) -> RidgeProbe:
    """Closed-form ridge regression with an intercept, in float64; the dual form when there
    are more feature dimensions than samples (the same solution)."""
    x, y = as_matrix(x), _as_targets(y)
    x_mean, y_mean = x.mean(0), y.mean(0)
    xc, yc = x - x_mean, y - y_mean
    n, d = xc.shape
    if d <= n:
        weight = np.linalg.solve(xc.T @ xc + alpha * np.eye(d), xc.T @ yc)
    else:
        weight = xc.T @ np.linalg.solve(xc @ xc.T + alpha * np.eye(n), yc)
    return RidgeProbe(weight, y_mean - x_mean @ weight)


def _as_targets(values: ArrayLike) -> np.ndarray:
    """(N, K) float64 targets of (N,) or (N, K) values."""
    y = np.asarray(values.detach().cpu().numpy() if hasattr(values, "detach") else values,
                   dtype=np.float64)
    if y.ndim not in (1, 2):
        raise InputError(f"targets must be (N,) or (N, K), got shape {y.shape}")
    return y.reshape(len(y), -1)


def random_holdout(count: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(fit indices, held-out indices): a seeded random `fraction` held out (at least 2)."""
    order = np.random.default_rng(seed).permutation(count)
    held = max(2, round(fraction * count))
    return np.sort(order[held:]), np.sort(order[:held])


@dataclass(frozen=True)
class TargetProbeResult:
    """A linear probe of regression or multi-label targets: the task's metrics on the test
    split (`vitkit.tasks`: regression mae/rmse/r2, multi-label map/f1), the regularisation
    chosen on the held-out part of train and its held-out scores, the test outputs (values,
    or logits for multi-label)."""

    kind: str
    metrics: dict[str, Any]
    regularisation: float  # ridge alpha, or the logistic weight decay
    heldout: dict[float, float]  # grid value -> held-out R^2 or mAP
    outputs: np.ndarray

    def as_dict(self) -> dict[str, object]:
        from vitkit.tasks import make_task

        task = make_task(self.kind)
        name, score = task.probe_regularisation, task.primary_metric
        metrics = {k: v for k, v in self.metrics.items() if k != "test_loss"}
        return {**metrics, name: self.regularisation,
                f"heldout_{score}": {f"{v:g}": s for v, s in self.heldout.items()}}


def _check_holdout(count: int, what: str) -> None:
    if count < MIN_TRAIN_FOR_HOLDOUT:
        raise InputError(f"the {what} probe needs at least {MIN_TRAIN_FOR_HOLDOUT} training "
                         f"images to hold some out for choosing its regularisation, got "
                         f"{count}: use more training data")


def _tuned_target_probe(kind: str, names: list[str] | None, x_train: ArrayLike,
                        y_train: ArrayLike, x_test: ArrayLike, y_test: ArrayLike,
                        grid: tuple[float, ...],
                        fit_predict: Callable[[np.ndarray, np.ndarray, float, np.ndarray],
                                              np.ndarray],
                        seed: int, what: str) -> TargetProbeResult:
    """The probe of regression or multi-label targets: the regularisation picked from `grid`
    by the task's primary metric on a seeded random 10% of the training split (ties: the
    larger value), refitted on the whole training split and scored on the test split.
    `fit_predict(x_fit, y_fit, value, x_apply)` fits on standardised features and returns the
    outputs for `x_apply`. Features are standardised with the statistics of the split each
    probe is fitted on, as the classification probe does."""
    from vitkit.tasks import TaskSpec, make_task

    x_train, x_test = as_matrix(x_train), as_matrix(x_test)
    y_train, y_test = _as_targets(y_train), _as_targets(y_test)
    _check_holdout(len(y_train), what)
    task = make_task(TaskSpec(kind, names=names))
    fit, held = random_holdout(len(y_train), HOLDOUT_FRACTION, seed)
    x_fit, x_held = standardize(x_train[fit], x_train[held])
    heldout = {}
    for value in grid:
        outputs = fit_predict(x_fit, y_train[fit], value, x_held)
        heldout[value] = task.metrics(torch.from_numpy(outputs),
                                      torch.from_numpy(y_train[held]))[task.primary_metric]
    best = max(sorted(grid, reverse=True), key=lambda value: heldout[value])
    x_all, x_eval = standardize(x_train, x_test)
    outputs = fit_predict(x_all, y_train, best, x_eval)
    metrics = task.metrics(torch.from_numpy(outputs), torch.from_numpy(y_test))
    return TargetProbeResult(kind, metrics, best, heldout, outputs)


def ridge_probe(x_train: ArrayLike, y_train: ArrayLike, x_test: ArrayLike, y_test: ArrayLike,
                names: list[str] | None = None, alphas: tuple[float, ...] = RIDGE_ALPHAS,
                seed: int = 0) -> TargetProbeResult:
    """Ridge regression of (N,) or (N, K) real targets on frozen features, alpha picked by the
    held-out R^2 (`_tuned_target_probe`), scored with the regression task's metrics (R^2,
    MAE, RMSE as scikit-learn computes them)."""
    def fit_predict(x: np.ndarray, y: np.ndarray, alpha: float, apply: np.ndarray
                    ) -> np.ndarray:
        return fit_ridge(x, y, alpha).predict(apply)

    return _tuned_target_probe("regression", names, x_train, y_train, x_test, y_test, alphas,
                               fit_predict, seed, "ridge regression")


def fit_binary_logistic(x: ArrayLike, y: ArrayLike, weight_decay: float,
                        max_iter: int = MAX_ITER, tolerance: float = TOLERANCE) -> LogisticProbe:
    """One-vs-rest logistic regression of (N, K) 0/1 labels: mean binary cross-entropy +
    weight_decay / 2 * ||W||^2, full-batch L-BFGS (the labels' problems are independent)."""
    labels = torch.from_numpy(_as_targets(y))
    return _fit_linear_lbfgs(torch.from_numpy(as_matrix(x)), labels, labels.shape[1],
                             F.binary_cross_entropy_with_logits, weight_decay, max_iter,
                             tolerance)


def multilabel_probe(x_train: ArrayLike, y_train: ArrayLike, x_test: ArrayLike,
                     y_test: ArrayLike, names: list[str] | None = None,
                     weight_decays: tuple[float, ...] = WEIGHT_DECAYS,
                     seed: int = 0) -> TargetProbeResult:
    """One-vs-rest logistic regression of (N, K) 0/1 labels on frozen features, weight decay
    picked by the held-out mAP (`_tuned_target_probe`), scored with the multi-label task's
    metrics (mAP as scikit-learn's macro average precision, F1 at 0.5, per-label AP); the
    outputs are logits."""
    def fit_predict(x: np.ndarray, y: np.ndarray, weight_decay: float, apply: np.ndarray
                    ) -> np.ndarray:
        probe = fit_binary_logistic(x, y, weight_decay)
        return apply @ probe.weight + probe.bias

    return _tuned_target_probe("multilabel", names, x_train, y_train, x_test, y_test,
                               weight_decays, fit_predict, seed, "multi-label")


# The probe of each task's targets on frozen features, by its name (`Task.linear_probe`).
TARGET_PROBES: dict[str, Callable[..., TargetProbeResult]] = {
    "ridge regression": ridge_probe, "one-vs-rest logistic regression": multilabel_probe}
