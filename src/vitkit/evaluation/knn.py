"""Weighted k-nearest-neighbour classification on frozen features, as DINO's `eval_knn.py`:
cosine similarity of L2-normalised features, the k most similar training images vote for
their class with weight exp(similarity / T). The weights are computed as
exp((similarity - row max) / T), the same votes scaled per test image, so a small T neither
overflows nor underflows: it tends to 1-nearest-neighbour."""

from __future__ import annotations

import math

import numpy as np
import torch

from vitkit.errors import ConfigError
from vitkit.evaluation.feature_arrays import ArrayLike, as_labels, as_matrix, classification_split

KNN_K = 20
KNN_TEMPERATURE = 0.07


def check_temperature(temperature: float) -> None:
    """Refuse a vote temperature that is not a finite number > 0."""
    if not (math.isfinite(temperature) and temperature > 0):
        raise ConfigError(f"kNN temperature (--temperature) must be a finite number > 0, got "
                          f"{temperature}; DINO's is {KNN_TEMPERATURE}")


@torch.no_grad()
def knn_predictions(x_train: ArrayLike, y_train: ArrayLike, x_test: ArrayLike,
                    num_classes: int, k: int = KNN_K, temperature: float = KNN_TEMPERATURE,
                    chunk: int = 1024) -> np.ndarray:
    """Predicted test labels (the class with the largest summed vote), in float64."""
    check_temperature(temperature)
    if k < 1:
        raise ConfigError(f"kNN needs k >= 1 neighbours, got {k}; DINO's is {KNN_K}")
    train = torch.nn.functional.normalize(torch.from_numpy(as_matrix(x_train)), dim=1)
    test = torch.nn.functional.normalize(torch.from_numpy(as_matrix(x_test)), dim=1)
    labels = torch.from_numpy(as_labels(y_train))
    k = min(k, len(train))
    predictions = []
    for start in range(0, len(test), chunk):
        similarity = test[start:start + chunk] @ train.T
        top, index = similarity.topk(k, dim=1)
        votes = torch.zeros(len(top), num_classes, dtype=torch.float64)
        votes.scatter_add_(1, labels[index], _vote_weights(top, temperature))
        predictions.append(votes.argmax(dim=1))
    return torch.cat(predictions).numpy() if predictions else np.zeros(0, dtype=np.int64)


def _vote_weights(top: torch.Tensor, temperature: float) -> torch.Tensor:
    """exp(similarity / T) per row, divided by the row's largest (at most 1, at least one 1)."""
    return ((top - top[:, :1]) / temperature).exp()


def knn_accuracy(x_train: ArrayLike, y_train: ArrayLike, x_test: ArrayLike, y_test: ArrayLike,
                 num_classes: int, k: int = KNN_K, temperature: float = KNN_TEMPERATURE
                 ) -> float:
    """Top-1 accuracy of the weighted kNN classifier on the test set."""
    x_train, y_train, x_test, y_test = classification_split(x_train, y_train, x_test, y_test,
                                                            num_classes)
    predictions = knn_predictions(x_train, y_train, x_test, num_classes, k, temperature)
    return float(np.mean(predictions == y_test))
