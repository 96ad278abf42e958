"""`vitkit fewshot` and `vitkit probe`: frozen features in, a printable report, JSON and
(few-shot) a figure out."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vitkit.errors import InputError
from vitkit.evaluation.evaluate_weights import default_out_dir
from vitkit.evaluation.features import FrozenFeatures, frozen_features
from vitkit.evaluation.fewshot import (
    PAPER_L2,
    PAPER_SHOTS,
    FewShotResult,
    check_l2,
    fewshot_curve,
)
from vitkit.evaluation.knn import KNN_K, KNN_TEMPERATURE, check_temperature, knn_accuracy
from vitkit.evaluation.probe import TARGET_PROBES, linear_probe
from vitkit.report import Report
from vitkit.tasks import make_task

log = logging.getLogger("vitkit.evaluation")


def _header(features: FrozenFeatures) -> str:
    cached = ", from the cache" if features.from_cache else ""
    count = features.task_object.outputs_plural
    return (f"{features.data}: {len(features.train_y)} train / {len(features.test_y)} test "
            f"images, {features.num_classes} {count}; features: {features.representation}"
            f"{cached}")


def _write_json(path: str | Path | None, report: dict[str, Any]) -> str | None:
    if path is None:
        return None
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=2) + "\n")
    return str(path)


def _fewshot_one(weights: str | Path, data: str | None, data_dir: str | None,
                 shots: tuple[int, ...], seeds: int, l2_reg: float,
                 weights_dir: str | Path | None
                 ) -> tuple[FrozenFeatures, FewShotResult, dict[str, Any]]:
    def classes_only(kind: str) -> None:
        if not make_task(kind).class_labels:
            raise InputError(f"fewshot draws images per class, and {weights} is a {kind} "
                             "model: use vitkit probe, which fits a linear probe of its "
                             "targets on the frozen features")

    features = frozen_features(weights, data, data_dir, weights_dir, check_task=classes_only)
    result = fewshot_curve(features.train_x, features.train_y, features.test_x,
                           features.test_y, features.num_classes, shots, seeds, l2_reg,
                           features.classes)
    report = {"weights": str(weights), "data": features.data,
              "representation": features.representation, "train_images":
              len(features.train_y), "test_images": len(features.test_y),
              "classes": features.num_classes, **result.as_dict()}
    return features, result, report


def _comparison_table(results: dict[str, FewShotResult]) -> str:
    """Shots down, one `mean ± std` column per model."""
    width = max(16, *(len(label) for label in results))
    lines = [f"{'shots':>6}  " + "  ".join(f"{label:>{width}}" for label in results)]
    for n in next(iter(results.values())).shots:
        cells = (f"{100 * r.mean(n):.2f} ± {100 * r.std(n):.2f}" for r in results.values())
        lines.append(f"{n:>6}  " + "  ".join(f"{cell:>{width}}" for cell in cells))
    return "\n".join(lines)


def fewshot_report(weights: str | Path | Sequence[str | Path], data: str | None = None,
                   data_dir: str | None = None, shots: tuple[int, ...] = PAPER_SHOTS,
                   seeds: int = 3, l2_reg: float = PAPER_L2,
                   json_path: str | Path | None = None, out: str | Path | None = None,
                   weights_dir: str | Path | None = None) -> Report:
    """Few-shot linear accuracy (mean ± std over seeds) per shot count.

    Several weights are compared on the same data, shots and seeds: one table each, a
    side-by-side table, and one curve per model in fewshot.png. The figure goes to `out`
    (default: `default_out_dir`, as for `vitkit eval`: beside the first weights, in a run or
    model folder; ./eval for a checkpoint name or hf-hub: repository); the report (for
    several weights, {"models": [...]}) to `json_path`.
    """
    from vitkit.analysis.plots import plot_fewshot

    if seeds < 1 or not shots or min(shots) < 1:
        raise InputError("--shots needs counts >= 1 (e.g. 1,5,10,25) and --seeds at least 1")
    check_l2(l2_reg)
    sources = [weights] if isinstance(weights, (str, Path)) else list(weights)
    if not sources:
        raise InputError("fewshot needs at least one weights source")
    lines: list[str] = []
    results: dict[str, FewShotResult] = {}
    reports = []
    for source in sources:
        features, result, report = _fewshot_one(source, data, data_dir, shots, seeds, l2_reg,
                                                weights_dir)
        if len(sources) > 1:
            lines.append(f"== {source}")
        lines += [_header(features), f"few-shot linear evaluation (ridge regression, "
                  f"l2={l2_reg:g}, {seeds} seed(s), mean ± std over seeds):", result.table()]
        results[str(source)] = result
        reports.append(report)
        if len(reports) == 1:
            first_dir = default_out_dir(source, features.weights_file)
            first_data = features.data
    if len(sources) > 1:
        lines += ["== side by side (accuracy %, mean ± std over seeds)",
                  _comparison_table(results)]
    out_dir = Path(out) if out else first_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    curves = {label: ([r.mean(n) for n in r.shots], [r.std(n) for n in r.shots])
              for label, r in results.items()}
    shown = next(iter(results.values())).shots
    png = plot_fewshot(shown, curves, out_dir / "fewshot.png",
                       f"{first_data}: few-shot linear (l2={l2_reg:g}, {seeds} seeds)")
    lines.append(f"wrote {png}")
    combined = reports[0] if len(reports) == 1 else {"models": reports}
    written = _write_json(json_path, combined)
    if written:
        lines.append(f"wrote {written}")
    return Report("\n".join(lines), combined)


def probe_report(weights: str | Path, data: str | None = None, data_dir: str | None = None,
                 k: int = KNN_K, temperature: float = KNN_TEMPERATURE,
                 json_path: str | Path | None = None, weights_dir: str | Path | None = None
                 ) -> Report:
    """Linear-probe and weighted-kNN accuracy on the frozen features; for a regression model
    ridge regression (R^2, MAE, RMSE), for a multi-label model a one-vs-rest logistic
    probe (mAP, F1): `_target_probe`."""
    check_temperature(temperature)
    features = frozen_features(weights, data, data_dir, weights_dir)
    if not features.task_object.class_labels:
        return _target_probe(weights, features, json_path)
    args = (features.train_x, features.train_y, features.test_x, features.test_y,
            features.num_classes)
    probe = linear_probe(*args)
    knn = knn_accuracy(*args, k=k, temperature=temperature)
    used = min(k, len(features.train_y))  # knn_predictions caps k at the training images
    if used < k:
        log.warning("kNN: k=%d is more than the %d training images; every one votes (k=%d)",
                    k, used, used)
    report = {"weights": str(weights), "data": features.data,
              "representation": features.representation, "train_images":
              len(features.train_y), "test_images": len(features.test_y),
              "classes": features.num_classes, "linear_probe": probe.as_dict(),
              "knn": {"accuracy": knn, "k": used, "k_asked": k, "temperature": temperature}}
    grid = ", ".join(f"{wd:g}: {100 * acc:.2f}%" for wd, acc in probe.heldout_accuracy.items())
    lines = [_header(features),
             f"linear probe: weight decay by held-out 10% of train: {grid}",
             f"  chosen weight decay {probe.weight_decay:g}; test accuracy "
             f"{100 * probe.accuracy:.2f}%",
             f"kNN (k={used}{f', {k} asked' if used < k else ''}, T={temperature:g}, "
             f"cosine): test accuracy {100 * knn:.2f}%"]
    written = _write_json(json_path, report)
    if written:
        lines.append(f"wrote {written}")
    return Report("\n".join(lines), report)


def _target_probe(weights: str | Path, features: FrozenFeatures,
                  json_path: str | Path | None) -> Report:
    """The probe of a regression or multi-label model's targets (no kNN: it votes classes)."""
    task = features.task_object
    args = (features.train_x, features.train_y, features.test_x, features.test_y, task.names)
    result = TARGET_PROBES[task.linear_probe](*args)
    report = {"weights": str(weights), "data": features.data, "task": features.kind,
              "representation": features.representation, "train_images":
              len(features.train_y), "test_images": len(features.test_y),
              "outputs": features.num_classes, "linear_probe": result.as_dict()}
    grid = ", ".join(f"{v:g}: {score:.4f}" for v, score in result.heldout.items())
    lines = [_header(features), *task.probe_lines(result.metrics, result.regularisation, grid)]
    lines.append(f"kNN: not run (it votes for classes; the targets are {task.knn_words})")
    written = _write_json(json_path, report)
    if written:
        lines.append(f"wrote {written}")
    return Report("\n".join(lines), report)
