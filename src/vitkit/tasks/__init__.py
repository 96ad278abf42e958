"""The task a model is trained for, and everything that depends on it: what a target is, the
loss, the checks on targets (training and held out), the head's size, the augmentations it
allows, the metrics (an accumulator per evaluation), which score is better (best.pt), how a
prediction, an evaluation and a training row are reported, and what an exported graph
outputs. One class per task; `make_task` is the door. Nothing outside this package asks
which task it holds: it calls the task's methods.

    spec.py            TaskSpec: what a weights record and a run store (`to_dict` /
                       `from_dict`); the losses of each task
    infer.py           infer_task: the task that training targets imply
    base.py            Task (the interface), EvalResult, ranks (all-reduce, all-gather)
    classification.py  one class per image: top-1 / top-5, counted with a confusion matrix
    per_output.py      K values per image (regression and multi-label share it)
    regression.py      real values: mae / rmse / r2, standardised targets
    multilabel.py      0/1 labels: map / f1 (as scikit-learn computes them)

Models built from a record carry their TaskSpec as `model.task` (`task_of`).
"""

from __future__ import annotations

import torch

from vitkit.tasks.base import (
    Accumulator,
    EvalResult,
    Ranks,
    SingleProcess,
    Task,
    all_gather,
    all_reduce_sum,
    value_names,
)
from vitkit.tasks.classification import (
    TOP_K,
    Classification,
    check_class_labels,
    match_classes,
    one_hot_smooth,
    reports_top_k,
    soft_cross_entropy,
)
from vitkit.tasks.infer import infer_task
from vitkit.tasks.multilabel import MULTILABEL_THRESHOLD, Multilabel, average_precision
from vitkit.tasks.regression import Regression
from vitkit.tasks.spec import (
    LOSS_ALIASES,
    LOSS_MEANINGS,
    LOSSES,
    TASKS,
    TaskSpec,
    distinct_output_names,
    loss_suggestion,
)

__all__ = ["LOSSES", "LOSS_ALIASES", "LOSS_MEANINGS", "MULTILABEL_THRESHOLD", "PRIMARY_METRIC",
           "TASKS", "TOP_K", "Accumulator", "Classification", "EvalResult", "Multilabel",
           "Ranks", "Regression", "SingleProcess", "Task", "TaskSpec", "all_gather",
           "all_reduce_sum", "average_precision", "check_class_labels",
           "distinct_output_names", "infer_task", "loss_suggestion", "make_task",
           "match_classes", "one_hot_smooth", "reports_top_k", "soft_cross_entropy",
           "task_of", "value_names"]

_CLASSES: dict[str, type[Task]] = {cls.kind: cls for cls in (Classification, Regression,
                                                             Multilabel)}
# What "better" means for best.pt and early comparisons: the task's primary metric, higher wins.
PRIMARY_METRIC = {kind: cls.primary_metric for kind, cls in _CLASSES.items()}


def make_task(spec: Task | TaskSpec | str | None = None) -> Task:
    """The task object of a spec (or of a task name; None: classification; a Task: itself)."""
    if isinstance(spec, Task):
        return spec
    if spec is None or isinstance(spec, str):
        spec = TaskSpec(kind=spec or TaskSpec.kind)
    return _CLASSES[spec.kind](spec)


def task_of(model: torch.nn.Module) -> Task:
    """The task a model carries (`model.task`, set when it is built from a record or trained);
    classification with the model's class names when it carries none."""
    spec = getattr(model, "task", None)
    if spec is None:
        spec = TaskSpec(names=getattr(model, "class_names", None))
    return make_task(spec)
