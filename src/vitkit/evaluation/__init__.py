"""Evaluation in one package.

    loop.py           the one evaluation loop: evaluate(predictor, feed, task) -> EvalResult,
                      the task's accumulator over the batches, combined over ranks
                      (training's evaluation and `vitkit eval`'s)
    splits.py         which data and split weights are evaluated on (a run's own by default)
    report.py         `vitkit eval`: evaluate_checkpoint -> eval.json, confusion PNG, report
    features.py       frozen features of a data set, cached
    fewshot.py        few-shot linear evaluation (big_vision's closed-form ridge regression)
    probe.py, knn.py  linear probes (logistic; ridge for regression targets, one-vs-rest
                      logistic for multi-label), weighted kNN
    frozen_report.py  `vitkit fewshot` and `vitkit probe`: their reports and figure
"""

from vitkit.evaluation.evaluate_weights import evaluate_checkpoint
from vitkit.evaluation.features import FrozenFeatures, extract_features, frozen_features
from vitkit.evaluation.fewshot import (
    FewShotResult,
    fewshot_curve,
    fewshot_lsr_accuracy,
    fewshot_lsr_predictions,
    ridge_solver,
    sample_shots,
)
from vitkit.evaluation.frozen_report import fewshot_report, probe_report
from vitkit.evaluation.knn import knn_accuracy, knn_predictions
from vitkit.evaluation.probe import (
    ProbeResult,
    TargetProbeResult,
    fit_logistic,
    fit_ridge,
    linear_probe,
    multilabel_probe,
    ridge_probe,
)

__all__ = [
    "FewShotResult", "FrozenFeatures", "ProbeResult", "TargetProbeResult", "evaluate_checkpoint",
    "extract_features", "fewshot_curve",
    "fewshot_lsr_accuracy", "fewshot_lsr_predictions", "fewshot_report", "fit_logistic",
    "fit_ridge", "frozen_features", "knn_accuracy", "knn_predictions", "linear_probe",
    "multilabel_probe", "probe_report", "ridge_probe", "ridge_solver", "sample_shots",
]
