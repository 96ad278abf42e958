"""`vitkit eval`: any weights vitkit reads, evaluated on a data set: top-1, top-5 (printed
with more than 5 classes), loss, per-class accuracy, the JSON report and a confusion-matrix
PNG. Weights trained for regression report mae, rmse, r2 and per_output; for multi-label
classification map, f1 and per_label (`vitkit.tasks`; no confusion matrix or top-k).

Each evaluation keeps its own report,
`eval-<data>[-<folder>]-<split>[-first<N>][-int8|-bf16][-mergeR][-flip].json` (`<folder>`: the
last part of a data folder given with the data, unless it is the data's name; `<split>`: a
Hugging Face dataset's split by its name; `first<N>`: the first N images read, the run's
test_limit or `--limit N`; a later
evaluation on other data, folder, split or limit, or through another speed path, does not
overwrite it);
`eval.json` and `confusion_matrix.png` are the latest evaluation's, as Hugging Face's
Trainer keeps `eval_results.json`."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import torch

from vitkit.catalog import read_weights
from vitkit.data.feeds import EvaluationFeed
from vitkit.errors import DataError, first_few
from vitkit.evaluation.classify import evaluate, reports_top_k
from vitkit.evaluation.splits import data_for, recorded_limit_key, split_to_evaluate
from vitkit.evaluation.task_eval import evaluate_task
from vitkit.inference.precision import (
    Precision,
    measurement_batch,
    requested_precision,
    run_in_precision,
)
from vitkit.inference.speedup import speed_up
from vitkit.inference.tta import recorded_tta, warn_if_never_flipped, with_tta
from vitkit.report import Report
from vitkit.tasks import Task, make_task
from vitkit.weights import build_model

log = logging.getLogger("vitkit.evaluation")
LATEST_REPORT = "eval.json"  # the latest evaluation's report, beside the one it keeps


def _check_fits(dataset: EvaluationFeed, num_classes: int,
                in_chans: int, data: str) -> None:
    if num_classes <= 0:
        raise DataError("these weights have no classification head (num_classes=0), so there "
                        f"is nothing to evaluate: fine-tune a head first (vitkit finetune "
                        f"WEIGHTS --data {data})")
    if dataset.channels != in_chans:
        raise DataError(f"the {data} images have {dataset.channels} channel(s) but the model "
                        f"takes {in_chans}: evaluate on data with {in_chans} channel(s)")
    if dataset.labels is None:
        return  # a stream's labels are known only as it is read
    check_class_labels(dataset, data, f"{num_classes} classes")
    top = int(dataset.labels.max())
    if top >= num_classes:
        raise DataError(f"{data} has labels up to {top} but the model has {num_classes} "
                        f"outputs: fine-tune it on this data first (vitkit finetune WEIGHTS "
                        f"--data {data})")


def evaluate_checkpoint(path: str | Path, data: str | None = None, data_dir: str | None = None,
                        split: str | None = None, out: str | Path | None = None,
                        limit: int | str | None = None, batch_size: int = 500,
                        weights_dir: str | Path | None = None, merge_tokens: int = 0,
                        int8: str | None = None, precision: str | None = None,
                        tta: str | None = None) -> Report:
    """Evaluate weights (any format `load_pretrained` reads) and write the report to
    `eval_report_name(...)` and eval.json (the latest), and confusion_matrix.png; returns the
    report (its data is the JSON's).

    `merge_tokens` (ToMe, per layer) and `int8` (an engine of `vitkit.inference.quantize`)
    evaluate the model through those speed paths (`vitkit.inference.speedup.speed_up`);
    `precision` (fp32, bf16, int8 or auto; None: fp32, or int8 with `int8`) the number
    format, merging first (`vitkit.inference.precision`; auto measures on min(batch_size, 8)
    random images). `tta` (none or flip, `vitkit.inference.tta`; None: the training run's)
    averages the outputs over mirror images. eval.json records each, with the precision's
    reason.

    `split`: "train", "test" or a Hugging Face split's name (None: the held-out split; a
    Hugging Face dataset's split called test is read when "test" is named).
    The data defaults to a training checkpoint's own (data, folder and image limit:
    `limit="all"` reads every image); other weights need `data`. Images go through the
    weights' preprocessing (mean/std) and are resized to the model's size when theirs differs.
    """
    from vitkit.analysis.plots import plot_confusion

    named, split = split is not None, split or "test"
    weights = read_weights(path, weights_dir)
    model = build_model(weights)
    config = model.config
    fast, context, chosen = _in_precision(speed_up(model, merge_tokens), precision, int8,
                                          batch_size)
    tta = recorded_tta(tta, weights.eval_tta)
    warn_if_never_flipped(tta, weights.train_config, weights.preprocess.pictures)
    fast = with_tta(fast, tta)
    int8 = chosen.engine if chosen.name == "int8" else None  # the engine that ran
    folder = _given_folder_name(data or (weights.train_config or {}).get("data"), data_dir)
    asked, (data, data_dir, limit) = limit, data_for(weights, data, data_dir, split, limit)
    if asked is None and limit is not None:
        log.info("%s: the first %d images, as the training run read them (its %s); --limit "
                 "all reads every image", split, limit, recorded_limit_key(split))
    task = make_task(weights.task)

    def check_fits(dataset: EvaluationFeed) -> None:
        if task.kind == "classification":
            _check_fits(dataset, config.num_classes, config.in_chans, data)
        else:
            _check_targets_fit(dataset, task, config.num_classes, config.in_chans, data)

    dataset, split = split_to_evaluate(weights, data, data_dir, split, limit, config.img_size,
                                       config.in_chans, check_first=check_fits, named=named)
    if tuple(dataset.image_size) != tuple(config.img_size):
        log.info("the %s images are %dx%d and the model takes %dx%d: resizing them (bilinear, "
                 "antialiased when shrinking)", data, *dataset.image_size, *config.img_size)
    out_dir = Path(out) if out else default_out_dir(path, weights.path)
    kept_name = eval_report_name(data, split, merge_tokens, chosen.name, tta, folder, limit)
    head = {"checkpoint": str(path), "origin": weights.origin, "weights": weights.weights,
            "data": data, "data_dir": data_dir, "split": split, "merge_tokens": merge_tokens,
            "int8": int8, "tta": tta,
            "precision": chosen.name, "precision_reason": chosen.reason}
    speed = "".join([f", int8 ({int8})" if int8 else "", ", bf16" if chosen.name == "bf16" else "",
                     f", {merge_tokens} tokens merged per layer" if merge_tokens else "",
                     f", {tta} TTA" if tta != "none" else ""])
    if precision is not None or int8:
        log.info("%s", chosen.describe())
    if task.kind != "classification":
        scored = evaluate_task(fast, dataset, task, weights.preprocess, batch_size,
                               image_size=config.img_size, context=context)
        report = {**head, "task": task.kind, "images": scored.count,
                  "loss": scored.metrics["test_loss"],
                  **{k: v for k, v in scored.metrics.items() if k != "test_loss"}}
        return _write_report(report, out_dir, kept_name,
                             task_lines(task, report, f"{data} {split}, {scored.count} "
                                                      f"images{speed}"))
    label_map = match_classes(list(dataset.classes), weights.class_names, data)
    result = evaluate(fast, dataset, config.num_classes, weights.preprocess, batch_size,
                      image_size=config.img_size, context=context, label_map=label_map)
    classes = list(dataset.classes) if label_map is None and \
        len(dataset.classes) == config.num_classes else \
        list(weights.class_names or [f"class {i}" for i in range(config.num_classes)])
    out_dir.mkdir(parents=True, exist_ok=True)
    per_class = {name: round(float(acc), 4) for name, acc in zip(classes, result.per_class,
                                                                 strict=False)}
    if label_map is not None:  # the data's classes only, not the model's others at 0%
        per_class = {classes[i]: per_class[classes[i]] for i in label_map.tolist()}
    report = {**head, "images": result.count, "top1": result.top1,
              "top5": result.top5, "loss": result.loss, "per_class_accuracy": per_class,
              "confusion": result.confusion.tolist()}
    text = json.dumps(report, indent=2) + "\n"
    kept = out_dir / kept_name
    kept.write_text(text)
    (out_dir / LATEST_REPORT).write_text(text)
    png = plot_confusion(result.confusion, classes, out_dir / "confusion_matrix.png",
                         f"{data} {split}: top-1 {100 * result.top1:.2f}%")
    top5 = f"top-5 {100 * result.top5:.2f}%, " if reports_top_k(config.num_classes) else ""
    lines = [f"{data} {split}, {result.count} images{speed}: top-1 {100 * result.top1:.2f}%, "
             f"{top5}loss {result.loss:.4f}", "per-class accuracy:"]
    lines += [f"  {name:<12} {100 * acc:6.2f}%" for name, acc in per_class.items()]
    lines.append(f"wrote {kept} (and {LATEST_REPORT}, the latest) and {png}")
    return Report("\n".join(lines), report)


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


def check_class_labels(dataset: EvaluationFeed, data: str, classes: str) -> None:
    """Refuse a split whose targets are not integer class labels for a classifier (its
    `classes` in words); a stream's labels are known only as it is read."""
    if dataset.labels is not None and not _class_labels(dataset.labels):
        raise DataError(f"{data} has {_describe_targets(dataset.labels)} but the model is a "
                        f"classifier (task=classification, {classes}): evaluate "
                        "on data with integer class labels: a folder of class sub-folders "
                        "(or whose targets.csv has one column of class indices 0, 1, ...), "
                        "digits, cifar10, or arrays whose targets are integers")


def _class_labels(labels: torch.Tensor) -> bool:
    """Whether a split's targets are (N,) integer class indices, as every source delivers
    class labels (regression and multi-label targets come as float (N, K))."""
    return labels.ndim == 1 and not labels.is_floating_point()


def _describe_targets(labels: torch.Tensor) -> str:
    """A split's targets in words, for a message: integer class labels, or float / 0/1
    targets of their shape."""
    if _class_labels(labels):
        return f"integer class labels (shape {tuple(labels.shape)})"
    shape = tuple(labels.shape)
    if labels.ndim == 2 and labels.shape[1] > 1 and bool(((labels == 0) | (labels == 1)).all()):
        return f"0/1 multi-label targets of shape {shape}"
    return f"float targets of shape {shape}"


_TASK_DATA = {
    "regression": ("a regression model", "float target(s)",
                   "arrays whose targets are floats, a folder whose splits hold a targets.csv, "
                   "or a Hugging Face dataset with a float column"),
    "multilabel": ("multi-label", "0/1 label(s)",
                   "arrays whose targets are (N, K) 0/1, a folder whose splits hold a "
                   "targets.csv of 0/1 columns, or a Hugging Face dataset with a label-list "
                   "column"),
}


def _check_targets_fit(dataset: EvaluationFeed, task: Task, outputs: int, in_chans: int,
                       data: str) -> None:
    """Regression and multi-label weights: the split's targets must be K values (labels) per
    image, K the model's outputs. Class labels (integer (N,)) of a classification source are
    refused; integer targets of arrays may be values (counts), so they are scored, with a
    warning."""
    if dataset.channels != in_chans:
        raise DataError(f"the {data} images have {dataset.channels} channel(s) but the model "
                        f"takes {in_chans}: evaluate on data with {in_chans} channel(s)")
    labels = dataset.labels
    if labels is None:
        raise DataError(f"{data} is streamed and its targets are known only as it is read: "
                        f"task={task.kind} weights are evaluated on data held in memory")
    if _class_labels(labels):
        if data != "arrays":
            model, values, sources = _TASK_DATA[task.kind]
            raise DataError(f"{data} has {_describe_targets(labels)} but the model is {model} "
                            f"(task={task.kind}, {outputs} output(s)): evaluate on data with "
                            f"{outputs} {values} per image: {sources}")
        log.warning("warning: the arrays' targets are integers (shape %s): they are scored as "
                    "%s; if they are class labels, evaluate on data of the model's task",
                    tuple(labels.shape), "values" if task.kind == "regression" else "0/1 labels")
    labels = labels.reshape(len(labels), -1)
    word = "target(s)" if task.kind == "regression" else "label(s)"
    if labels.shape[1] != outputs:
        raise DataError(f"{data} has {labels.shape[1]} {word} per image but the model "
                        f"predicts {outputs} (task={task.kind}): evaluate on data with "
                        f"{outputs} {word} per image")
    if task.kind == "multilabel" and not bool(((labels == 0) | (labels == 1)).all()):
        raise DataError(f"{data} has targets other than 0 and 1, but the model is multi-label: "
                        "evaluate on 0/1 label targets")


def task_lines(task: Task, report: dict, title: str) -> list[str]:
    """The printed lines of a regression or multi-label evaluation: the set's metrics, then
    one line per output (label)."""
    if task.kind == "regression":
        lines = [f"{title}: R^2 {report['r2']:.4f}, MAE {report['mae']:.4g}, RMSE "
                 f"{report['rmse']:.4g}, loss {report['loss']:.4f}", "per output:"]
        lines += [f"  {name:<12} R^2 {m['r2']:.4f}  MAE {m['mae']:.4g}  RMSE {m['rmse']:.4g}"
                  for name, m in report["per_output"].items()]
        return lines
    lines = [f"{title}: mAP {report['map']:.4f}, F1 {report['f1']:.4f} (at 0.5), loss "
             f"{report['loss']:.4f}", "per label:"]
    lines += [f"  {name:<12} AP {m['ap']:.4f}  F1 {m['f1']:.4f}"
              for name, m in report["per_label"].items()]
    return lines


def _write_report(report: dict, out_dir: Path, kept_name: str, lines: list[str]) -> Report:
    """Write the kept report and eval.json (the latest); the printed text ends naming them."""
    out_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(report, indent=2) + "\n"
    kept = out_dir / kept_name
    kept.write_text(text)
    (out_dir / LATEST_REPORT).write_text(text)
    lines.append(f"wrote {kept} (and {LATEST_REPORT}, the latest)")
    return Report("\n".join(lines), report)


def _in_precision(model: torch.nn.Module, precision: str | None, int8: str | None,
                  batch_size: int
                  ) -> tuple[torch.nn.Module, Callable[[], AbstractContextManager], Precision]:
    """The model to evaluate (an int8 or bf16 copy, `apply_precision`), the context to run it
    in, and the precision chosen (auto: measured on min(batch_size, 8) random images of the
    model's shape)."""
    requested = requested_precision(precision, int8)
    device = next(model.parameters()).device
    config = model.config
    batch = measurement_batch(config.in_chans, config.img_size, batch_size) \
        if requested in ("auto", "int8") else None
    return run_in_precision(requested, device, model, batch, int8_engine=int8)


def eval_report_name(data: str, split: str, merge_tokens: int = 0,
                     precision: str | None = None, tta: str = "none",
                     folder: str | None = None, first: int | None = None) -> str:
    """"eval-digits-test.json", "eval-hf_ylecun_mnist-test-int8-merge8.json",
    "eval-cifar10-test-flip.json", "eval-folder-pets-test-first5.json": one report per data
    (and data folder given), split (a Hugging Face dataset's by its name), image limit
    (`first`: the run's test_limit, or --limit N), speed path and test-time augmentation, so
    evaluations never overwrite each other. `precision`: fp32 or None, bf16,
    or int8 (an int8 engine's name, "torch", also means int8)."""
    label = None if precision in (None, "fp32") else "bf16" if precision == "bf16" else "int8"
    parts = [data, *([folder] if folder else []), split, *([f"first{first}"] if first else []),
             *([label] if label else []),
             *([f"merge{merge_tokens}"] if merge_tokens else []),
             *([tta] if tta != "none" else [])]
    return "eval-" + "-".join(re.sub(r"[^A-Za-z0-9._]+", "_", part).strip("_")
                              for part in parts) + ".json"


def _given_folder_name(data: str | None, data_dir: str | None) -> str | None:
    """The last part of a data folder given with the data, for a kept report's name (so
    evaluations of one run on two folders keep two reports); None without one (a run's own
    folder, read without --data-dir, leaves the name as the data's)."""
    if not data_dir:
        return None
    folder = Path(os.path.abspath(os.path.expanduser(data_dir))).name
    return folder if folder and folder != data else None


def default_out_dir(source: str | Path, weights_file: Path | None) -> Path:
    """Beside the weights file (for a folder or a run folder: in it); ./eval for a name."""
    if not Path(source).exists() or weights_file is None:
        return Path("eval")
    return weights_file.parent
