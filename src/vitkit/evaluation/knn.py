"""Weighted k-nearest-neighbour classification on frozen features, as DINO's `eval_knn.py`:
cosine similarity of L2-normalised features, the k most similar training images vote for
their class with weight exp(similarity / T)."""

from __future__ import annotations

import numpy as np
import torch

from vitkit.evaluation.arrays import ArrayLike, as_labels, as_matrix

KNN_K = 20
KNN_TEMPERATURE = 0.07


@torch.no_grad()
def knn_predictions(x_train: ArrayLike, y_train: ArrayLike, x_test: ArrayLike,
                    num_classes: int, k: int = KNN_K, temperature: float = KNN_TEMPERATURE,
                    chunk: int = 1024) -> np.ndarray:
    """Predicted test labels (the class with the largest summed vote), in float64."""
    train = torch.nn.functional.normalize(torch.from_numpy(as_matrix(x_train)), dim=1)
    test = torch.nn.functional.normalize(torch.from_numpy(as_matrix(x_test)), dim=1)
    labels = torch.from_numpy(as_labels(y_train))
    k = min(k, len(train))
    predictions = []
    for start in range(0, len(test), chunk):
        similarity = test[start:start + chunk] @ train.T
        top, index = similarity.topk(k, dim=1)
        votes = torch.zeros(len(top), num_classes, dtype=torch.float64)
        votes.scatter_add_(1, labels[index], (top / temperature).exp())
        predictions.append(votes.argmax(dim=1))
    return torch.cat(predictions).numpy() if predictions else np.zeros(0, dtype=np.int64)


def knn_accuracy(x_train: ArrayLike, y_train: ArrayLike, x_test: ArrayLike, y_test: ArrayLike,
                 num_classes: int, k: int = KNN_K, temperature: float = KNN_TEMPERATURE
                 ) -> float:
    """Top-1 accuracy of the weighted kNN classifier on the test set."""
    predictions = knn_predictions(x_train, y_train, x_test, num_classes, k, temperature)
    return float(np.mean(predictions == as_labels(y_test)))
