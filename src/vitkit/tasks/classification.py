"""Classification: one class per image. Targets are int64 class indices (N,); the head has
one logit per class; soft cross-entropy (label smoothing, Mixup/CutMix mix the one-hot
targets); metrics top-1 / top-5, counted batch by batch with a confusion matrix and summed
over ranks; outputs reported as softmax probabilities of the named classes."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from vitkit.errors import ConfigError, DataError, InputError, first_few
from vitkit.tasks.base import (
    EvalResult,
    Ranks,
    Task,
    all_reduce_sum,
    check_channels,
    describe_targets,
    holds_class_labels,
)
from vitkit.tasks.infer import infer_task

log = logging.getLogger("vitkit.tasks")

TOP_K = 5  # the second accuracy reported, after top-1


def reports_top_k(num_classes: int, k: int = TOP_K) -> bool:
    """Whether top-k accuracy says anything: only with more than k classes (with k or fewer
    every image is right within its top k). Reports print top-k only then."""
    return num_classes > k


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


class ClassCounts:
    """Classification's accumulator: the summed loss, top-1 and top-5 hits and the confusion
    matrix (float64 counts), summed over ranks in one all-reduce."""

    def __init__(self, num_classes: int | None = None) -> None:
        self.sized = num_classes is not None  # the same on every rank
        self.num_classes = num_classes or 0
        self.loss_sum = torch.zeros((), dtype=torch.float64)
        self.correct = torch.zeros(2, dtype=torch.float64)
        self.confusion = torch.zeros(self.num_classes, self.num_classes, dtype=torch.float64)
        self.totals: torch.Tensor | None = None

    def update(self, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        logits = outputs.float()
        if not self.sized and not self.num_classes:
            self._resize(logits.shape[1])
        num_classes = self.num_classes
        labels = targets.to(logits.device)
        self.loss_sum += F.cross_entropy(logits, labels, reduction="sum").double().cpu()
        topk = logits.topk(min(TOP_K, num_classes), dim=1).indices
        hits = topk == labels[:, None]
        self.correct[0] += hits[:, 0].sum().double().cpu()
        self.correct[1] += hits.any(dim=1).sum().double().cpu()
        flat = labels.cpu() * num_classes + topk[:, 0].cpu()
        self.confusion += torch.bincount(flat, minlength=num_classes**2).reshape(
            num_classes, num_classes).double()

    def _resize(self, num_classes: int) -> None:
        self.num_classes = num_classes
        self.confusion = torch.zeros(num_classes, num_classes, dtype=torch.float64)

    def _totals(self) -> torch.Tensor:
        return torch.cat([self.loss_sum[None], self.correct, self.confusion.flatten()])

    def sync(self, ranks: Ranks) -> None:
        if ranks.enabled and not self.sized:  # a rank without batches learns the class count
            size = torch.tensor([self.num_classes])
            dist.all_reduce(size, op=dist.ReduceOp.MAX)
            if int(size) != self.num_classes:
                self._resize(int(size))
        self.totals = all_reduce_sum(self._totals(), ranks)

    def compute(self, interrupted: bool = False) -> EvalResult:
        totals = self.totals if self.totals is not None else self._totals()
        count = int(totals[3:].sum().item())
        metrics = {"test_loss": float(totals[0]) / max(count, 1),
                   "top1": float(totals[1]) / max(count, 1),
                   "top5": float(totals[2]) / max(count, 1)}
        confusion = totals[3:].reshape(self.num_classes, self.num_classes).long()
        return EvalResult(metrics, count, "top1", interrupted, confusion=confusion)


class Classification(Task):
    kind = "classification"
    primary_metric = "top1"
    outputs_word = "class(es)"
    outputs_plural = "classes"
    class_labels = True
    sampled_words = "across classes"
    onnx_meaning = "logits: softmax gives class probabilities"

    def output_name(self, index: int) -> str:
        """A class's name; "class N" where the data names none (integer array labels), as
        predict, eval and explain's titles say."""
        names = self.names
        return names[index] if names and index < len(names) else f"class {index}"

    # -- training ---------------------------------------------------------------------------
    def training_targets(self, labels: torch.Tensor, num_outputs: int,
                         label_smoothing: float = 0.0) -> torch.Tensor:
        return one_hot_smooth(labels, num_outputs, label_smoothing)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return soft_cross_entropy(outputs, targets)

    def output_count(self, train: Any, test: Any = None) -> int:
        """Classes (labels that name none: the indices of both splits, `index_class_count`)."""
        where = train.name or "the data"
        return check_two_classes(len(train.classes) or index_class_count(train, test, where),
                                 train, where)

    def size_head(self, cfg: Any, config: Any, train: Any, test: Any = None) -> Any:
        """A fresh classifier: the head has one output per class found (arrays: the largest
        label + 1) when the model leaves `num_classes` unset (a variant name, or a model dict
        without it), on any data (so `model=Ti/16` on the digits gets 10 outputs, not
        ImageNet's 1000). Set to another number, it is refused for data whose classes are its
        own (folder, arrays, hf:); on the digits and CIFAR it is kept (a head with spare
        outputs trains)."""
        if cfg.init_from:
            return config  # fine-tuning gives the pretrained model a new head (`output_count`)
        where = cfg.data_dir or cfg.data
        found = check_two_classes(len(train.classes) or (
            index_class_count(train, test, where) if cfg.data == "arrays" else 0), train, where)
        if not found or config.num_classes == found:
            return config
        named_classes = cfg.data in ("folder", "arrays") or cfg.data.startswith("hf:")
        set_in_model = isinstance(cfg.model, dict) and "num_classes" in cfg.model
        if set_in_model and not named_classes:
            return config  # check_training_labels refuses a head too small for the labels
        if set_in_model:
            names = list(train.classes) or [str(i) for i in range(found)]
            raise ConfigError(f"model.num_classes={config.num_classes} but the data {where} "
                              f"holds {found} classes ({first_few(names)}): set "
                              f"model.num_classes={found} (or use a recipe whose model leaves "
                              "num_classes unset, and the head is sized from the data)")
        log.info("data=%s: %d classes found, the head has %d outputs", cfg.data, found, found)
        return config.replace(num_classes=found)

    def check_training_labels(self, num_outputs: int, train: Any) -> None:
        labels = torch.as_tensor(train.labels)
        top = int(labels.max())
        if top >= num_outputs or int(labels.min()) < 0:
            raise DataError(f"labels run from {int(labels.min())} to {top} but the head has "
                            f"{num_outputs} outputs: set model.num_classes={top + 1}")

    def check_held_out(self, labels: Any, where: str) -> None:
        """Class indices that are negative or not whole are refused, as in training."""
        labels = np.asarray(labels)
        if labels.ndim == 1 and labels.size:
            bad = np.flatnonzero((labels < 0) | (labels != np.round(labels)))
            if len(bad):
                raise DataError(f"the held-out targets of {where} hold {len(bad)} value(s) "
                                f"that are no class index ({first_few(labels[bad].tolist())}, "
                                f"at index {first_few(bad.tolist())}): class indices are whole "
                                "numbers from 0, as in the training split; fix or drop those "
                                "rows")
        infer_task(labels, self.kind, where=f"the held-out targets of {where}")

    # -- evaluation -------------------------------------------------------------------------
    def metrics(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
        logits, labels = outputs.float(), targets.long()
        k = min(TOP_K, logits.shape[1])
        top = logits.topk(k, dim=1).indices
        hits = top == labels[:, None]
        return {"test_loss": float(F.cross_entropy(logits, labels)),
                "top1": float(hits[:, 0].float().mean()), "top5": float(hits.any(1).float().mean())}

    def accumulator(self, num_outputs: int | None = None,
                    where: str = "the held-out split") -> ClassCounts:
        return ClassCounts(num_outputs)

    def check_eval_data(self, dataset: Any, num_outputs: int, in_chans: int,
                        data: str) -> None:
        if num_outputs <= 0:
            raise DataError("these weights have no classification head (num_classes=0), so "
                            "there is nothing to evaluate: fine-tune a head first (vitkit "
                            f"finetune WEIGHTS --data {data})")
        check_channels(dataset, in_chans, data)
        if dataset.labels is None:
            return  # a stream's labels are known only as it is read
        check_class_labels(dataset, data, f"{num_outputs} classes")
        top = int(dataset.labels.max())
        if top >= num_outputs:
            raise DataError(f"{data} has labels up to {top} but the model has {num_outputs} "
                            f"outputs: fine-tune it on this data first (vitkit finetune "
                            f"WEIGHTS --data {data})")

    def check_feature_data(self, dataset: Any, data: str) -> None:
        check_class_labels(dataset, data, "frozen features are read per class")

    def output_map(self, data_classes: list[str], model_classes: list[str] | None,
                   data: str) -> torch.Tensor | None:
        return match_classes(data_classes, model_classes, data)

    def eval_report(self, result: EvalResult, head: dict[str, Any], names: list[str],
                    output_map: torch.Tensor | None = None) -> dict[str, Any]:
        """top-1, top-5, loss, each class's accuracy (with an `output_map`: the data's
        classes only, not the model's others at 0%) and the confusion matrix."""
        per_class = {name: round(float(acc), 4)
                     for name, acc in zip(names, result.per_class, strict=False)}
        if output_map is not None:
            per_class = {names[i]: per_class[names[i]] for i in output_map.tolist()}
        metrics = result.metrics
        return {**head, "images": result.count, "top1": metrics["top1"],
                "top5": metrics["top5"], "loss": metrics["test_loss"],
                "per_class_accuracy": per_class, "confusion": result.confusion.tolist()}

    def eval_lines(self, report: dict[str, Any], title: str, num_outputs: int) -> list[str]:
        top5 = f"top-5 {100 * report['top5']:.2f}%, " if reports_top_k(num_outputs) else ""
        lines = [f"{title}: top-1 {100 * report['top1']:.2f}%, {top5}loss "
                 f"{report['loss']:.4f}", "per-class accuracy:"]
        return lines + [f"  {name:<12} {100 * acc:6.2f}%"
                        for name, acc in report["per_class_accuracy"].items()]

    def primary_words(self, score: float) -> str:
        return f"top-1 {100 * score:.2f}%"

    def metric_text(self, score: float) -> str:
        return f"{100 * score:.2f}%"

    def epoch_words(self, row: dict[str, float], num_outputs: int) -> str:
        top5 = f"  top-5 {100 * row['top5']:.2f}%" if reports_top_k(num_outputs) else ""
        return f"test top-1 {100 * row['top1']:.2f}%{top5}"

    def final_words(self, row: dict[str, float], num_outputs: int) -> str:
        informative = not num_outputs or reports_top_k(num_outputs)
        top5 = f", top-5 {100 * row['top5']:.2f}%" if "top5" in row and informative else ""
        return f"test top-1 {100 * row['top1']:.2f}%{top5}"

    # -- outputs ----------------------------------------------------------------------------
    def decode(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs.float().softmax(-1)

    def describe(self, outputs: torch.Tensor, top_k: int = 5,
                 names: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """The `top_k` most probable classes of each image (capped at the class count)."""
        probs = self.decode(outputs.detach())
        values, indices = probs.topk(min(top_k, probs.shape[1]), dim=1)
        label = (lambda i: names[i]) if names else self.output_name
        return [{"top": [{"label": label(i), "index": i, "prob": p}
                         for p, i in zip(row_p, row_i, strict=True)]}
                for row_p, row_i in zip(values.tolist(), indices.tolist(), strict=True)]

    def row_names(self, class_names: Callable[[], list[str]]) -> list[str] | None:
        return class_names()

    def fill_row(self, row: Any, report: dict[str, Any]) -> None:
        top = report["top"]
        row.task = self.kind
        row.labels = [entry["label"] for entry in top]
        row.indices = [entry["index"] for entry in top]
        row.probs = [entry["prob"] for entry in top]

    def row_json(self, row: Any) -> dict[str, Any]:
        return {"topk": [{"label": label, "index": index, "prob": prob} for label, index, prob
                         in zip(row.labels, row.indices, row.probs, strict=True)]}

    def row_text(self, row: Any) -> str:
        return ", ".join(f"{label} ({100 * prob:.2f}%)"
                         for label, prob in zip(row.labels, row.probs, strict=True))

    def title_words(self, outputs: torch.Tensor, class_names: Sequence[str] | None,
                    num_classes: int) -> str | None:
        if num_classes < 2:
            return None
        probs = outputs.softmax(dim=-1)
        index = int(probs.argmax())
        label = class_names[index] if class_names and index < len(class_names) else \
            f"class {index}"
        return f"{label} ({100 * probs[index].item():.0f}%)"

    def agreement_words(self, agreement: float) -> str:
        return f", top-1 agreement {100 * agreement:.0f}%"


# -- the data's classes ---------------------------------------------------------------------------
def check_two_classes(found: int, train: Any, where: str) -> int:
    """`found`, the classes of the data: refused when there is one, which a classifier learns
    to 100% without learning anything (most often a folder laid out one level off)."""
    if found == 1:
        named = f" ({train.classes[0]})" if train.classes else ""
        raise DataError(f"{where} holds one class{named}, and a classifier needs two or more: "
                        "give the data two classes or more (a folder: one sub-folder per class "
                        "in train/ and in val/, train/<class>/<image>); for values rather "
                        "than classes: task=regression")
    return found


def index_class_count(train: Any, test: Any, where: str) -> int:
    """Classes of data that names none (integer array labels are class indices): the largest
    index of either split + 1, so a held-out class the training split lacks has an output
    (logged: it is never trained). Refused when most of those indices never occur (labels
    1000-1002, or counts): the head would be mostly outputs that are never trained."""
    seen = np.unique(np.asarray(train.labels))
    held_labels = np.asarray(test.labels) if test is not None and test.labels is not None \
        else None
    held = np.unique(held_labels) if held_labels is not None and held_labels.ndim == 1 \
        else seen[:0]
    count = int(max(seen.max(), held.max(initial=0))) + 1
    occurring = len(np.union1d(seen, held))
    if occurring < count // 2:
        raise DataError(f"{where}: the integer labels are read as class indices, which run to "
                        f"{count - 1} while only {occurring} occur, so the head would have "
                        f"{count} outputs, most never trained: number the classes 0.."
                        f"{occurring - 1} in both splits, or, if the labels are quantities "
                        "(counts, measurements), train task=regression")
    unseen = np.setdiff1d(held, seen)
    if len(unseen):
        log.warning("warning: %s: class index(es) %s occur in the held-out split but never in "
                    "training, so their outputs are never trained", where,
                    first_few(int(i) for i in unseen))
    absent = np.setdiff1d(np.arange(count), np.union1d(seen, held))
    if len(absent):
        numbered_from = " (classes numbered from 1?)" if absent.tolist() == [0] else ""
        log.warning("warning: %s: class index(es) %s occur in neither split%s, but the head "
                    "has an output for each, never trained: number the classes 0..%d",
                    where, first_few(int(i) for i in absent), numbered_from, occurring - 1)
    return count


def match_classes(data_classes: list[str], model_classes: list[str] | None,
                  data: str) -> torch.Tensor | None:
    """The model's output for each of the data's classes, matched by name where the two name
    them differently (a folder of some of the model's classes, or in another order); None
    where they are the same, or cannot be matched (then scored by position, with a warning
    when neither names one class of the other). Data naming classes the model lacks among
    ones it has is refused: scored by position, it would be scored against other classes."""
    if not data_classes or not model_classes or data_classes == list(model_classes):
        return None
    output = {name: i for i, name in enumerate(model_classes)}
    twice = [name for name in data_classes if list(model_classes).count(name) > 1]
    if twice:  # ImageNet names "crane" and "maillot" twice: no one output to match
        log.warning("warning: the model names %s more than once: the %s classes are scored "
                    "by position (the data's class i as the model's output i)",
                    first_few(twice), data)
        return None
    missing = [name for name in data_classes if name not in output]
    if len(missing) == len(data_classes):
        log.warning("warning: none of the %s classes (%s) is among the model's (%s): scored by "
                    "position (the data's class i as the model's output i)", data,
                    first_few(data_classes), first_few(model_classes))
        return None
    if missing:
        raise DataError(f"{data} has classes the model does not: {first_few(missing)} (the "
                        f"model's {len(model_classes)} are {first_few(model_classes)}): "
                        "evaluate on data of the model's classes, or fine-tune it on this data "
                        f"first (vitkit finetune WEIGHTS --data {data})")
    mapping = torch.tensor([output[name] for name in data_classes])
    if torch.equal(mapping, torch.arange(len(data_classes))):
        return None
    log.info("the %s classes are matched to the model's by name (%d of its %d)", data,
             len(data_classes), len(model_classes))
    return mapping


def check_class_labels(dataset: Any, data: str, classes: str) -> None:
    """Refuse a split whose targets are not integer class labels for a classifier (its
    `classes` in words); a stream's labels are known only as it is read."""
    if dataset.labels is not None and not holds_class_labels(dataset.labels):
        raise DataError(f"{data} has {describe_targets(dataset.labels)} but the model is a "
                        f"classifier (task=classification, {classes}): evaluate "
                        "on data with integer class labels: a folder of class sub-folders "
                        "(or whose targets.csv has one column of class indices 0, 1, ...), "
                        "digits, cifar10, or arrays whose targets are integers")
