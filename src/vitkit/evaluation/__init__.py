"""The paper's evaluation protocol on frozen features: few-shot linear evaluation (big_vision's
closed-form ridge regression), a logistic-regression linear probe and weighted kNN.

`vitkit.evaluate` (top-1/5 and the confusion matrix of a model's own head) stays beside it.
"""

from vitkit.evaluation.features import FrozenFeatures, extract_features, frozen_features
from vitkit.evaluation.fewshot import (
    FewShotResult,
    fewshot_curve,
    fewshot_lsr_accuracy,
    fewshot_lsr_predictions,
    ridge_solver,
    sample_shots,
)
from vitkit.evaluation.knn import knn_accuracy, knn_predictions
from vitkit.evaluation.probe import ProbeResult, fit_logistic, linear_probe
from vitkit.evaluation.reports import fewshot_report, probe_report

__all__ = [
    "FewShotResult", "FrozenFeatures", "ProbeResult", "extract_features", "fewshot_curve",
    "fewshot_lsr_accuracy", "fewshot_lsr_predictions", "fewshot_report", "fit_logistic",
    "frozen_features", "knn_accuracy", "knn_predictions", "linear_probe", "probe_report",
    "ridge_solver", "sample_shots",
]
