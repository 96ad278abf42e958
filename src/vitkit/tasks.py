"""The task a model is trained for: what a target is, the loss, the metrics, which score is
better (best.pt) and how an output is reported. One class per task; `make_task` is the door.

- "classification": one class per image. Targets are int64 class indices (N,); the head has one
  logit per class; soft cross-entropy (label smoothing, Mixup/CutMix mix the one-hot targets);
  metrics top-1 / top-5 (`vitkit.evaluation.classify`); outputs reported as softmax
  probabilities of the named classes.
- "regression": one or more real quantities per image. Targets are float (N, K); the head has K
  outputs, trained on targets standardised with the training set's mean and std (stored in the
  `TaskSpec`, undone by `Task.decode`); loss "mse" (default), "huber" or "l1"; metrics `mae`,
  `rmse`, `r2` (each the mean over outputs, as scikit-learn's "uniform_average", and per
  output under the target names); outputs reported as values.
- "multilabel": any number of labels per image. Targets are 0/1 float (N, K); one logit per
  label; binary cross-entropy with logits; metrics `map` (macro average precision, as
  scikit-learn's `average_precision_score(average="macro")`: a label without positives scores
  0), `f1` (macro F1 of sigmoid >= 0.5) and per-label AP; outputs reported as sigmoid
  probabilities and the labels at or above 0.5.

The `TaskSpec` (kind, output names, loss, target standardisation) is what the weights record
and a run store (`to_dict` / `from_dict`); models built from a record carry it as `model.task`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from vitkit.errors import ConfigError, DataError, InputError, first_few
from vitkit.fieldtypes import check_known_keys, did_you_mean

__all__ = ["LOSSES", "LOSS_ALIASES", "LOSS_MEANINGS", "TASKS", "Classification", "Multilabel",
           "Regression", "Task", "TaskSpec", "average_precision", "infer_task",
           "loss_suggestion", "make_task", "one_hot_smooth", "soft_cross_entropy", "task_of"]

log = logging.getLogger("vitkit.tasks")

TASKS = ("classification", "regression", "multilabel")
LOSSES = {"classification": ("cross_entropy",), "regression": ("mse", "huber", "l1"),
          "multilabel": ("bce",)}
# What each loss is, named beside a suggestion. "huber" is F.huber_loss at its default delta 1
# (on the standardised targets): torch's HuberLoss(delta) is delta x SmoothL1Loss(beta=delta),
# so at 1 the two are the same loss.
LOSS_MEANINGS = {"cross_entropy": "softmax cross-entropy", "mse": "mean squared error",
                 "huber": "Huber loss with delta 1 on the standardised targets, the same as "
                          "smooth L1 with beta 1",
                 "l1": "mean absolute error", "bce": "binary cross-entropy with logits"}
# Other common names of the losses (compared after `_loss_key`): suggested with what they mean,
# never accepted in their place, so a config names one loss one way.
LOSS_ALIASES = {"mae": "l1", "mean_absolute_error": "l1", "l2": "mse",
                "mean_squared_error": "mse", "smooth_l1": "huber", "smoothl1": "huber",
                "ce": "cross_entropy", "crossentropy": "cross_entropy",
                "softmax": "cross_entropy", "softmax_cross_entropy": "cross_entropy",
                "bce_with_logits": "bce", "bcewithlogits": "bce",
                "binary_cross_entropy": "bce", "binary_crossentropy": "bce"}
# What "better" means for best.pt and early comparisons: the task's primary metric, higher wins.
PRIMARY_METRIC = {"classification": "top1", "regression": "r2", "multilabel": "map"}
MULTILABEL_THRESHOLD = 0.5


@dataclass
class TaskSpec:
    """What a set of weights was trained for, as stored beside them.

    `names` names the outputs: class names, target names or label names (None: unnamed).
    `target_mean` / `target_std` (regression only): the training targets' per-output mean and
    std; the head predicts `(y - mean) / std`.
    """

    kind: str = "classification"
    names: list[str] | None = None
    loss: str | None = None
    target_mean: list[float] | None = None
    target_std: list[float] | None = None

    def __post_init__(self) -> None:
        if self.kind not in TASKS:
            raise ConfigError(f"task={self.kind!r} is not one of {', '.join(TASKS)}")
        if self.loss is None:
            self.loss = LOSSES[self.kind][0]
        if self.loss not in LOSSES[self.kind]:
            allowed = ", ".join(LOSSES[self.kind])
            raise ConfigError(f"loss={self.loss!r} does not apply to task={self.kind} "
                              f"(it takes {allowed})."
                              + loss_suggestion(self.loss, LOSSES[self.kind]))
        if self.names is not None:
            self.names = [str(n) for n in self.names]
            repeated = _repeated(self.names) if self.kind != "classification" else []
            if repeated:  # its outputs are reported keyed by name (a class list is not)
                raise ConfigError(
                    f"the output names of a {self.kind} task repeat "
                    f"({', '.join(repr(n) for n in repeated)}): each output's values are "
                    "reported under its name, so one would hide the other; give every output "
                    "a name of its own")
        if (self.target_mean is None) != (self.target_std is None):
            raise ConfigError("target_mean and target_std come together")
        if self.target_mean is not None:
            if self.kind != "regression":
                raise ConfigError(f"target standardisation is for regression, not {self.kind}")
            self.target_mean = [float(m) for m in self.target_mean]
            self.target_std = [float(s) for s in self.target_std]
            if len(self.target_mean) != len(self.target_std) or min(self.target_std) <= 0:
                raise ConfigError("target_mean and target_std need one positive std per output")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskSpec:
        """A task as a file stores it; repeated output names (written before they were
        refused) are told apart as `distinct_output_names` does."""
        check_known_keys(cls, data, "task")
        if data.get("names") is not None and data.get("kind") != "classification":
            data = {**data, "names": distinct_output_names(data["names"])}
        return cls(**data)


def _repeated(names: Sequence[str]) -> list[str]:
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return [name for name, count in counts.items() if count > 1]


def distinct_output_names(names: Sequence[Any]) -> list[str]:
    """`names` with each repeated name told apart by its output ("cat (output 1)", "cat
    (output 2)"), logged: a file's multi-label or regression outputs keyed by name would
    otherwise fold into one."""
    names = [str(n) for n in names]
    repeated = set(_repeated(names))
    if not repeated:
        return names
    distinct = [f"{n} (output {i + 1})" if n in repeated else n for i, n in enumerate(names)]
    log.warning("output names repeat (%s): reported as %s", ", ".join(map(repr, repeated)),
                ", ".join(repr(d) for d, n in zip(distinct, names, strict=True) if n in repeated))
    return distinct


class Task:
    """The behaviour shared by every task; subclasses fill in the rest."""

    kind: str = ""

    def __init__(self, spec: TaskSpec) -> None:
        self.spec = spec

    @property
    def names(self) -> list[str] | None:
        return self.spec.names

    @property
    def primary_metric(self) -> str:
        return PRIMARY_METRIC[self.kind]

    def better(self, score: float, best: float | None) -> bool:
        """Whether `score` (of the primary metric) beats `best` (None: nothing yet)."""
        return best is None or score > best

    def output_name(self, index: int) -> str:
        names = self.names
        return names[index] if names and index < len(names) else str(index)

    # -- training ---------------------------------------------------------------------------
    def training_targets(self, labels: torch.Tensor, num_outputs: int,
                         label_smoothing: float = 0.0) -> torch.Tensor:
        """The float (B, num_outputs) targets the loss compares outputs with (what Mixup
        mixes)."""
        raise NotImplementedError

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean loss of float outputs (B, K) against `training_targets` (B, K)."""
        raise NotImplementedError

    # -- outputs ----------------------------------------------------------------------------
    def decode(self, outputs: torch.Tensor) -> torch.Tensor:
        """Model outputs -> what they mean: class probabilities, values in the targets' units,
        or label probabilities."""
        raise NotImplementedError

    def describe(self, outputs: torch.Tensor, top_k: int = 5) -> list[dict[str, Any]]:
        """One JSON-ready report per image of a batch of model outputs (detached: reporting
        never joins a graph)."""
        raise NotImplementedError

    def metrics(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
        """The task's metrics of a whole set: decoded outputs vs raw targets."""
        raise NotImplementedError


class Classification(Task):
    kind = "classification"

    def training_targets(self, labels: torch.Tensor, num_outputs: int,
                         label_smoothing: float = 0.0) -> torch.Tensor:
        return one_hot_smooth(labels, num_outputs, label_smoothing)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return soft_cross_entropy(outputs, targets)

    def decode(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs.float().softmax(-1)

    def output_name(self, index: int) -> str:
        """A class's name; "class N" where the data names none (integer array labels), as
        predict, eval and explain's titles say."""
        names = self.names
        return names[index] if names and index < len(names) else f"class {index}"

    def describe(self, outputs: torch.Tensor, top_k: int = 5) -> list[dict[str, Any]]:
        probs = self.decode(outputs.detach())
        k = min(top_k, probs.shape[1])
        values, indices = probs.topk(k, dim=1)
        return [{"top": [{"label": self.output_name(int(i)), "index": int(i), "prob": float(p)}
                         for p, i in zip(row_p, row_i, strict=True)]}
                for row_p, row_i in zip(values, indices, strict=True)]

    def metrics(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
        logits, labels = outputs.float(), targets.long()
        k = min(5, logits.shape[1])
        top = logits.topk(k, dim=1).indices
        hits = top == labels[:, None]
        return {"test_loss": float(F.cross_entropy(logits, labels)),
                "top1": float(hits[:, 0].float().mean()), "top5": float(hits.any(1).float().mean())}


class Regression(Task):
    kind = "regression"

    def _stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        spec = self.spec
        k = like.shape[-1]
        mean = spec.target_mean or [0.0] * k
        std = spec.target_std or [1.0] * k
        return (torch.tensor(mean, dtype=torch.float32, device=like.device),
                torch.tensor(std, dtype=torch.float32, device=like.device))

    def standardise(self, targets: torch.Tensor) -> torch.Tensor:
        mean, std = self._stats(targets)
        return (targets.float() - mean) / std

    def training_targets(self, labels: torch.Tensor, num_outputs: int,
                         label_smoothing: float = 0.0) -> torch.Tensor:
        if label_smoothing:
            raise ConfigError("label_smoothing is for classification: a regression target is "
                              "a value, not a class; drop label_smoothing (or set it to 0)")
        return self.standardise(labels.reshape(len(labels), -1))

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        outputs = outputs.float()
        if self.spec.loss == "huber":
            return F.huber_loss(outputs, targets)
        if self.spec.loss == "l1":
            return F.l1_loss(outputs, targets)
        return F.mse_loss(outputs, targets)

    def decode(self, outputs: torch.Tensor) -> torch.Tensor:
        mean, std = self._stats(outputs)
        return outputs.float() * std + mean

    def describe(self, outputs: torch.Tensor, top_k: int = 5) -> list[dict[str, Any]]:
        values = self.decode(outputs.detach())
        return [{"values": [float(v) for v in row],
                 "named": {self.output_name(j): float(v) for j, v in enumerate(row)}}
                for row in values]

    def metrics(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
        pred = self.decode(outputs).double()
        true = targets.reshape(len(targets), -1).double()
        err = pred - true
        mae = err.abs().mean(0)
        rmse = err.pow(2).mean(0).sqrt()
        total = (true - true.mean(0)).pow(2).sum(0)
        residual = err.pow(2).sum(0)
        # scikit-learn's r2_score: 1 for a perfect fit of a constant target, else 0 there
        r2 = torch.where(total > 0, 1 - residual / total.clamp(min=1e-300),
                         torch.where(residual == 0, 1.0, 0.0).double())
        per = {self.output_name(j): {"mae": float(mae[j]), "rmse": float(rmse[j]),
                                     "r2": float(r2[j])} for j in range(len(mae))}
        loss = self.loss(outputs, self.standardise(true.float()))
        return {"test_loss": float(loss), "mae": float(mae.mean()), "rmse": float(rmse.mean()),
                "r2": float(r2.mean()), "per_output": per}


class Multilabel(Task):
    kind = "multilabel"

    def training_targets(self, labels: torch.Tensor, num_outputs: int,
                         label_smoothing: float = 0.0) -> torch.Tensor:
        if label_smoothing:
            raise ConfigError("label_smoothing is for single-label classification; drop it "
                              "for task=multilabel (or set it to 0)")
        return labels.float().reshape(len(labels), -1)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(outputs.float(), targets)

    def decode(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs.float().sigmoid()

    def describe(self, outputs: torch.Tensor, top_k: int = 5) -> list[dict[str, Any]]:
        probs = self.decode(outputs.detach())
        return [{"probs": {self.output_name(j): float(p) for j, p in enumerate(row)},
                 "labels": [self.output_name(j) for j, p in enumerate(row)
                            if p >= MULTILABEL_THRESHOLD]}
                for row in probs]

    def metrics(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
        scores = self.decode(outputs).double()
        truth = targets.reshape(len(targets), -1) > 0.5
        ap = average_precision(scores, truth)
        predicted = scores >= MULTILABEL_THRESHOLD
        tp = (predicted & truth).sum(0).double()
        fp = (predicted & ~truth).sum(0).double()
        fn = (~predicted & truth).sum(0).double()
        denominator = 2 * tp + fp + fn
        f1 = torch.where(denominator > 0, 2 * tp / denominator.clamp(min=1), 0.0)
        loss = self.loss(outputs, truth.float())
        return {"test_loss": float(loss), "map": float(ap.mean()), "f1": float(f1.mean()),
                "per_label": {self.output_name(j): {"ap": float(ap[j]), "f1": float(f1[j])}
                              for j in range(len(ap))}}


def _loss_key(name: str) -> str:
    """"Smooth-L1 Loss" -> "smooth_l1": lower case, "_" for spaces and dashes, no "loss" at
    the end (torch's class names: "MSELoss", "SmoothL1Loss")."""
    key = "_".join(name.strip().lower().replace("-", " ").split())
    return key.removesuffix("loss").rstrip("_") or key


def loss_suggestion(loss: str, allowed: Sequence[str]) -> str:
    """" Did you mean 'l1' (mean absolute error)?" for a common name of a loss ("mae", "ce",
    "smooth_l1", "MSELoss"; LOSS_ALIASES) in `allowed`; for one of another task's losses, which
    task takes it; else `did_you_mean`'s spelling match ("" when none is close)."""
    if not isinstance(loss, str):
        return ""
    key = _loss_key(loss)
    name = LOSS_ALIASES.get(key, key)
    if name not in LOSS_MEANINGS:
        return did_you_mean(loss, allowed)
    tasks = " or ".join(f"task={kind}" for kind, names in LOSSES.items() if name in names)
    if name == loss:  # vitkit's own name, of another task
        return f" {loss!r} ({LOSS_MEANINGS[name]}) is a loss of {tasks}."
    if name in allowed:
        return f" Did you mean {name!r} ({LOSS_MEANINGS[name]})?"
    return f" {loss!r} is {name!r} here ({LOSS_MEANINGS[name]}), a loss of {tasks}."


def one_hot_smooth(labels: torch.Tensor, num_classes: int, smoothing: float = 0.0
                   ) -> torch.Tensor:
    """Float (B, num_classes) targets: `1 - smoothing + smoothing / num_classes` on the true
    class, `smoothing / num_classes` elsewhere."""
    if labels.dim() != 1:
        raise InputError(f"labels must be (B,), got {tuple(labels.shape)}")
    if not 0.0 <= smoothing <= 1.0:
        raise InputError(f"smoothing must be in [0, 1], got {smoothing}")
    off = smoothing / num_classes
    out = torch.full((labels.shape[0], num_classes), off, device=labels.device)
    return out.scatter_(1, labels.long()[:, None], 1.0 - smoothing + off)


def soft_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of `-(targets * log_softmax(logits)).sum(-1)`."""
    return -(targets * F.log_softmax(logits, dim=-1)).sum(-1).mean()


def average_precision(scores: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Per-column average precision, as scikit-learn's `average_precision_score`:
    sum over distinct score thresholds (descending) of (R_n - R_{n-1}) * P_n; a column without
    positives scores 0."""
    result = torch.zeros(scores.shape[1], dtype=torch.float64)
    for j in range(scores.shape[1]):
        order = torch.argsort(scores[:, j], descending=True, stable=True)
        s, t = scores[order, j], truth[order, j].double()
        positives = t.sum()
        if positives == 0:
            continue
        last_of_group = torch.ones(len(s), dtype=torch.bool)
        last_of_group[:-1] = s[1:] != s[:-1]
        tp = t.cumsum(0)[last_of_group]
        seen = torch.arange(1, len(s) + 1, dtype=torch.float64)[last_of_group]
        precision, recall = tp / seen, tp / positives
        steps = torch.diff(recall, prepend=torch.zeros(1, dtype=torch.float64))
        result[j] = (steps * precision).sum()
    return result


_CLASSES = {"classification": Classification, "regression": Regression,
            "multilabel": Multilabel}


def make_task(spec: TaskSpec | str | None = None) -> Task:
    """The task object of a spec (or of a task name; None: classification)."""
    if spec is None or isinstance(spec, str):
        spec = TaskSpec(kind=spec or "classification")
    return _CLASSES[spec.kind](spec)


def task_of(model: torch.nn.Module) -> Task:
    """The task a model carries (`model.task`, set when it is built from a record or trained);
    classification with the model's class names when it carries none."""
    spec = getattr(model, "task", None)
    if spec is None:
        spec = TaskSpec(names=getattr(model, "class_names", None))
    return make_task(spec)


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
    _warn_of_regression_targets(values, std, binary and requested is None, array.ndim, where)
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
                                where: str) -> None:
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
    if len(constant) == values.shape[1] == 1:
        log.warning("warning: %s are all %g: there is nothing to learn (R^2 reads 1 for an "
                    "exact fit, else 0); check the targets file", where, values[0, 0])
        return
    shown = ", ".join(f"{k} (always {values[0, k]:g})" for k in constant[:5])
    log.warning("warning: %s: target column(s) %s never change: there is nothing to learn "
                "there and their R^2 reads 1 for an exact fit, else 0; drop them", where, shown)
