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
from pathlib import Path

import torch

from vitkit.catalog import read_weights
from vitkit.data.feeds import EvaluationFeed
from vitkit.evaluation.loop import evaluate
from vitkit.evaluation.splits import data_for, recorded_limit_key, split_to_evaluate
from vitkit.inference.predictor import InferenceOptions, Predictor
from vitkit.report import Report
from vitkit.tasks import make_task

log = logging.getLogger("vitkit.evaluation")
LATEST_REPORT = "eval.json"  # the latest evaluation's report, beside the one it keeps


def evaluate_checkpoint(path: str | Path, data: str | None = None, data_dir: str | None = None,
                        split: str | None = None, out: str | Path | None = None,
                        limit: int | str | None = None, batch_size: int = 500,
                        weights_dir: str | Path | None = None, merge_tokens: int = 0,
                        int8: str | None = None, precision: str | None = None,
                        tta: str | None = None, *,
                        options: InferenceOptions | None = None) -> Report:
    """Evaluate weights (any format `load_pretrained` reads) and write the report to
    `eval_report_name(...)` and eval.json (the latest), and confusion_matrix.png; returns the
    report (its data is the JSON's).

    The model runs as a `vitkit.inference.predictor.Predictor` with `options` (or the loose
    arguments): `merge_tokens` (ToMe, per layer) and `int8` (an engine of
    `vitkit.inference.int8_engines`) evaluate it through those speed paths; `precision`
    (fp32, bf16, int8 or auto; None: fp32, or int8 with `int8`) the number format, merging
    first (`vitkit.inference.precision`; auto measures on min(batch_size, 8) random images).
    `tta` (none or flip, `vitkit.inference.tta`; None: the training run's) averages the
    outputs over mirror images. eval.json records each, with the precision's reason.

    `split`: "train", "test" or a Hugging Face split's name (None: the held-out split; a
    Hugging Face dataset's split called test is read when "test" is named).
    The data defaults to a training checkpoint's own (data, folder and image limit:
    `limit="all"` reads every image); other weights need `data`. Images go through the
    weights' preprocessing (mean/std) and are resized to the model's size when theirs differs.
    """
    from vitkit.analysis.plots import plot_confusion

    named, split = split is not None, split or "test"
    options = InferenceOptions.given(options, precision=precision, int8=int8,
                                     merge_tokens=merge_tokens, tta=tta,
                                     measure_batch=batch_size)
    weights = read_weights(path, weights_dir)
    predictor = Predictor.from_record(weights, options, source=path, announce=False)
    config, chosen, tta = predictor.model.config, predictor.precision, predictor.tta
    merge_tokens = options.merge_tokens
    int8 = chosen.engine if chosen.name == "int8" else None  # the engine that ran
    folder = _given_folder_name(data or (weights.train_config or {}).get("data"), data_dir)
    asked, (data, data_dir, limit) = limit, data_for(weights, data, data_dir, split, limit)
    if asked is None and limit is not None:
        log.info("%s: the first %d images, as the training run read them (its %s); --limit "
                 "all reads every image", split, limit, recorded_limit_key(split))
    task = make_task(weights.task)

    def check_fits(dataset: EvaluationFeed) -> None:
        task.check_eval_data(dataset, config.num_classes, config.in_chans, data)

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
    if options.asked:
        log.info("%s", predictor.describe_precision())
    label_map = task.output_map(list(dataset.classes), weights.class_names, data)
    result = evaluate(predictor, dataset, task, batch_size=batch_size, label_map=label_map)
    names = output_names(list(dataset.classes), weights.class_names, config.num_classes,
                         label_map)
    report = task.eval_report(result, head, names, label_map)
    out_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(report, indent=2) + "\n"
    kept = out_dir / kept_name
    kept.write_text(text)
    (out_dir / LATEST_REPORT).write_text(text)
    lines = task.eval_lines(report, f"{data} {split}, {result.count} images{speed}",
                            config.num_classes)
    written = f"wrote {kept} (and {LATEST_REPORT}, the latest)"
    if result.confusion is not None:  # the tasks that count one draw it
        png = plot_confusion(result.confusion, names, out_dir / "confusion_matrix.png",
                             f"{data} {split}: {task.primary_words(result.score)}")
        written += f" and {png}"
    return Report("\n".join([*lines, written]), report)


def output_names(data_classes: list[str], model_classes: list[str] | None, outputs: int,
                 label_map: torch.Tensor | None) -> list[str]:
    """The names of the model's outputs in a report: the data's classes where they are the
    model's outputs in order, else the names the model stores, else "class N"."""
    if label_map is None and len(data_classes) == outputs:
        return list(data_classes)
    return list(model_classes or [f"class {i}" for i in range(outputs)])


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
