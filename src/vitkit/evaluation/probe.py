"""Linear probe: multinomial logistic regression on standardised frozen features.

The loss is mean cross-entropy + (weight_decay / 2) * ||W||^2 (the bias unpenalised),
minimised full-batch by L-BFGS in float64. This is scikit-learn's LogisticRegression with
C = 1 / (weight_decay * N) (it minimises C * sum of cross-entropies + ||W||^2 / 2). The weight
decay is chosen on a stratified, seeded 10% of the training split held out, from a log-spaced
grid; the probe is then refitted on the whole training split and scored on the test split.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from vitkit.errors import InputError
from vitkit.evaluation.arrays import ArrayLike, as_labels, as_matrix, standardize

WEIGHT_DECAYS = tuple(float(v) for v in np.logspace(-5, 0, 6))  # 1e-5 ... 1
HOLDOUT_FRACTION = 0.1
SINGLE_THREAD_WORK = 2**24  # below this many multiply-adds per pass, threads cost more than help


@contextmanager
def _threads_for(work: int) -> Iterator[None]:
    """One torch thread for small problems (thread hand-offs dominate a tiny matmul, badly so
    on a busy machine), the current count otherwise; restored afterwards."""
    before = torch.get_num_threads()
    if work < SINGLE_THREAD_WORK:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class LogisticProbe:
    """A fitted linear classifier on standardised features: logits = x @ weight + bias."""

    weight: np.ndarray  # (D, C)
    bias: np.ndarray  # (C,)
    iterations: int

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.argmax(x @ self.weight + self.bias, axis=1)


def fit_logistic(x: ArrayLike, y: ArrayLike, num_classes: int, weight_decay: float,
                 max_iter: int = 1000, tolerance: float = 1e-9) -> LogisticProbe:
    """Minimise mean cross-entropy + weight_decay / 2 * ||W||^2 with full-batch L-BFGS."""
    features = torch.from_numpy(as_matrix(x))
    labels = torch.from_numpy(as_labels(y))
    weight = torch.zeros(features.shape[1], num_classes, dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(num_classes, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], lr=1.0, max_iter=max_iter, history_size=20,
                                  tolerance_grad=tolerance, tolerance_change=1e-14,
                                  line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(features @ weight + bias, labels) \
            + 0.5 * weight_decay * weight.pow(2).sum()
        loss.backward()
        return loss

    with _threads_for(features.numel() * num_classes):
        optimizer.step(closure)
    iterations = optimizer.state[weight].get("n_iter", 0)
    return LogisticProbe(weight.detach().numpy(), bias.detach().numpy(), int(iterations))


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
                 seed: int = 0) -> ProbeResult:
    """Pick the weight decay on a held-out 10% (ties: the larger decay), refit on the whole
    training split, score on the test split. Features are standardised with the statistics of
    the split each probe is fitted on."""
    x_train, x_test = as_matrix(x_train), as_matrix(x_test)
    y_train, y_test = as_labels(y_train), as_labels(y_test)
    if np.bincount(y_train).max(initial=0) < 2:
        raise InputError("the linear probe needs at least two training images of some class "
                         "to hold one out for choosing the weight decay: use more training data")
    fit, held = stratified_holdout(y_train, HOLDOUT_FRACTION, seed)
    x_fit, x_held = standardize(x_train[fit], x_train[held])
    heldout = {}
    for wd in weight_decays:
        probe = fit_logistic(x_fit, y_train[fit], num_classes, wd)
        heldout[wd] = float(np.mean(probe.predict(x_held) == y_train[held]))
    best = max(sorted(weight_decays, reverse=True), key=lambda wd: heldout[wd])
    x_all, x_eval = standardize(x_train, x_test)
    predictions = fit_logistic(x_all, y_train, num_classes, best).predict(x_eval)
    return ProbeResult(float(np.mean(predictions == y_test)), best, heldout, predictions)
