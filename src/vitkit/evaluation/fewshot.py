"""Few-shot linear evaluation: closed-form ridge regression on frozen features (the paper's
protocol, computed as big_vision's `evaluators/fewshot_lsr.py` does).

Features are standardised with the training set's mean and (population) std, with 1e-5 added
to the std; a constant bias feature of 100 is appended (large, so the bias is almost
unregularised); targets are 2 * one_hot - 1. The weights (X^T X + l2 I)^-1 X^T Y (primal, N >= D)
or X^T (X X^T + l2 I)^-1 Y (dual, D > N) come from one eigendecomposition of X^T X or X X^T,
so one decomposition serves any number of l2 values. Everything is computed in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vitkit.errors import ConfigError, InputError
from vitkit.evaluation.feature_arrays import ArrayLike, as_labels, as_matrix, classification_split

BIAS_FEATURE = 100.0
STD_EPSILON = 1e-5
PAPER_SHOTS = (1, 5, 10, 25)
PAPER_L2 = 2.0**10  # big_vision configs/common_fewshot.py: l2_reg = 2.0 ** 10


def check_l2(l2_reg: float) -> None:
    """Refuse a ridge regularisation that is not a finite number >= 0."""
    if not (math.isfinite(l2_reg) and l2_reg >= 0):
        raise ConfigError(f"few-shot ridge regularisation (--l2) must be a finite number >= 0, "
                          f"got {l2_reg}; big_vision's is {PAPER_L2:g}")


@dataclass(frozen=True)
class RidgeSolver:
    """The l2-independent part of the solve: whitening statistics and the eigendecomposition.

    weights(l2) = lhs @ diag(1 / (eigs + l2)) @ rhs.
    """

    mean: np.ndarray  # (D,)
    std: np.ndarray  # (D,), epsilon included
    eigs: np.ndarray  # (D+1,) primal or (N,) dual
    lhs: np.ndarray
    rhs: np.ndarray
    dual: bool  # decomposed X X^T (D > N) rather than X^T X

    def weights(self, l2_reg: float) -> np.ndarray:
        """(D + 1, C) regression weights, the last row for the bias feature."""
        check_l2(l2_reg)
        return (self.lhs / (self.eigs + l2_reg)[None, :]) @ self.rhs

    def design(self, x: np.ndarray) -> np.ndarray:
        """Standardise with the training statistics and append the bias feature."""
        x = (as_matrix(x) - self.mean) / self.std
        return np.concatenate([x, np.full((len(x), 1), BIAS_FEATURE)], axis=1)

    def predict(self, x: np.ndarray, l2_reg: float) -> np.ndarray:
        return np.argmax(self.design(x) @ self.weights(l2_reg), axis=1)


def ridge_solver(x_train: ArrayLike, y_train: ArrayLike, num_classes: int) -> RidgeSolver:
    """Standardise, add the bias feature, build the {-1, 1} targets and decompose."""
    x, y = as_matrix(x_train), as_labels(y_train)
    if len(x) != len(y) or len(x) == 0:
        raise InputError(f"{len(x)} training features but {len(y)} labels: pass one label per "
                         "feature row (and at least one row)")
    mean = x.mean(axis=0)
    std = x.std(axis=0) + STD_EPSILON
    design = np.concatenate([(x - mean) / std, np.full((len(x), 1), BIAS_FEATURE)], axis=1)
    targets = 2.0 * np.eye(num_classes)[y] - 1.0
    num_points, dim = design.shape
    if num_points >= dim:  # primal: (X^T X + l2 I)^-1 X^T Y
        eigs, q = np.linalg.eigh(design.T @ design)
        lhs, rhs = q, q.T @ (design.T @ targets)
    else:  # dual: X^T (X X^T + l2 I)^-1 Y
        eigs, q = np.linalg.eigh(design @ design.T)
        lhs, rhs = design.T @ q, q.T @ targets
    return RidgeSolver(mean, std, eigs, lhs, rhs, dual=num_points < dim)


def fewshot_lsr_predictions(x_train: ArrayLike, y_train: ArrayLike, x_test: ArrayLike,
                            num_classes: int, l2_reg: float = PAPER_L2) -> np.ndarray:
    """Predicted test labels of the ridge-regression classifier."""
    return ridge_solver(x_train, y_train, num_classes).predict(as_matrix(x_test), l2_reg)


def fewshot_lsr_accuracy(x_train: ArrayLike, y_train: ArrayLike, x_test: ArrayLike,
                         y_test: ArrayLike, num_classes: int, l2_reg: float = PAPER_L2) -> float:
    """Test accuracy of ridge regression fitted on (x_train, y_train): numpy or torch in."""
    x_train, y_train, x_test, y_test = classification_split(x_train, y_train, x_test, y_test,
                                                            num_classes)
    predictions = fewshot_lsr_predictions(x_train, y_train, x_test, num_classes, l2_reg)
    return float(np.mean(predictions == y_test))


def sample_shots(labels: np.ndarray, shots: list[int] | tuple[int, ...], seed: int,
                 num_classes: int, class_names: list[str] | None = None
                 ) -> dict[int, np.ndarray]:
    """For each shot count, `shots` training indices per class, drawn as big_vision does: one
    permutation of each class's indices per seed (numpy Generator(seed)), the first `shots`
    taken, so a larger shot count extends a smaller one. A class without training images
    (labels that skip a number, a class only the test split has) draws none, as big_vision's
    empty permutation does: it is never predicted."""
    labels = as_labels(labels)
    counts = np.bincount(labels, minlength=num_classes)
    present = np.flatnonzero(counts)
    if len(present) == 0:
        raise InputError("the training split has no labelled images to draw shots from")
    smallest = int(present[np.argmin(counts[present])])
    if max(shots) > counts[smallest]:
        name = class_names[smallest] if class_names and smallest < len(class_names) else \
            f"class {smallest}"
        raise InputError(
            f"{max(shots)} shots per class is more than the training split holds for "
            f"{name!r} ({counts[smallest]} images): the largest possible is --shots "
            f"{counts[smallest]}; ask for at most that many")
    rng = np.random.default_rng(seed)
    per_class = [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]
    return {n: np.concatenate([idx[:n] for idx in per_class]) for n in shots}


@dataclass(frozen=True)
class FewShotResult:
    """Accuracy per shot count and seed."""

    shots: list[int]
    seeds: int
    l2_reg: float
    accuracies: dict[int, list[float]]  # shots -> one accuracy per seed

    def mean(self, shots: int) -> float:
        return float(np.mean(self.accuracies[shots]))

    def std(self, shots: int) -> float:
        """Population std over seeds (ddof=0)."""
        return float(np.std(self.accuracies[shots]))

    def as_dict(self) -> dict[str, object]:
        return {"shots": self.shots, "seeds": self.seeds, "l2_reg": self.l2_reg,
                "accuracy": {str(n): {"mean": self.mean(n), "std": self.std(n),
                                      "per_seed": self.accuracies[n]} for n in self.shots}}

    def table(self) -> str:
        lines = [f"{'shots':>6}  {'accuracy %':>10}  {'std':>6}  per seed"]
        for n in self.shots:
            seeds = " ".join(f"{100 * a:.2f}" for a in self.accuracies[n])
            lines.append(f"{n:>6}  {100 * self.mean(n):>10.2f}  {100 * self.std(n):>6.2f}  "
                         f"{seeds}")
        return "\n".join(lines)


def fewshot_curve(x_train: ArrayLike, y_train: ArrayLike, x_test: ArrayLike,
                  y_test: ArrayLike, num_classes: int, shots: list[int] | tuple[int, ...]
                  = PAPER_SHOTS, seeds: int = 3, l2_reg: float = PAPER_L2,
                  class_names: list[str] | None = None) -> FewShotResult:
    """Few-shot accuracy for each shot count and seed 0..seeds-1, on the whole test split."""
    check_l2(l2_reg)
    if seeds < 1 or not shots or min(shots) < 1:
        raise ConfigError(f"few-shot needs shot counts >= 1 (e.g. 1, 5, 10, 25) and at least "
                          f"one seed, got shots {list(shots)} and seeds {seeds}")
    x_train, y_train, x_test, y_test = classification_split(x_train, y_train, x_test, y_test,
                                                            num_classes)
    shots = sorted(set(shots))
    accuracies: dict[int, list[float]] = {n: [] for n in shots}
    for seed in range(seeds):
        for n, idx in sample_shots(y_train, shots, seed, num_classes, class_names).items():
            predicted = fewshot_lsr_predictions(x_train[idx], y_train[idx], x_test,
                                                num_classes, l2_reg)  # checked once, above
            accuracies[n].append(float(np.mean(predicted == y_test)))
    return FewShotResult(shots, seeds, l2_reg, accuracies)
