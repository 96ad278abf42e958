"""`vitkit fewshot` and `vitkit probe`: frozen features in, a printable report, JSON and
(few-shot) a figure out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vitkit.errors import InputError
from vitkit.evaluate import default_out_dir
from vitkit.evaluation.features import FrozenFeatures, frozen_features
from vitkit.evaluation.fewshot import PAPER_L2, PAPER_SHOTS, fewshot_curve
from vitkit.evaluation.knn import KNN_K, KNN_TEMPERATURE, knn_accuracy
from vitkit.evaluation.probe import linear_probe


def _header(features: FrozenFeatures) -> str:
    cached = ", from the cache" if features.from_cache else ""
    return (f"{features.data}: {len(features.train_y)} train / {len(features.test_y)} test "
            f"images, {features.num_classes} classes; features: {features.representation}"
            f"{cached}")


def _write_json(path: str | Path | None, report: dict[str, Any]) -> str | None:
    if path is None:
        return None
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=2) + "\n")
    return str(path)


def fewshot_report(weights: str | Path, data: str | None = None, data_dir: str | None = None,
                   shots: tuple[int, ...] = PAPER_SHOTS, seeds: int = 3,
                   l2_reg: float = PAPER_L2, json_path: str | Path | None = None,
                   out: str | Path | None = None, weights_dir: str | Path | None = None
                   ) -> tuple[str, dict[str, Any]]:
    """Few-shot linear accuracy (mean ± std over seeds) per shot count: (text, report);
    writes fewshot.png to `out` (default: beside the weights) and the report to `json_path`."""
    from vitkit.analysis.plots import plot_fewshot

    if seeds < 1 or not shots or min(shots) < 1:
        raise InputError("--shots needs counts >= 1 (e.g. 1,5,10,25) and --seeds at least 1")
    features = frozen_features(weights, data, data_dir, weights_dir)
    result = fewshot_curve(features.train_x, features.train_y, features.test_x,
                           features.test_y, features.num_classes, shots, seeds, l2_reg,
                           features.classes)
    report = {"weights": str(weights), "data": features.data,
              "representation": features.representation, "train_images":
              len(features.train_y), "test_images": len(features.test_y),
              "classes": features.num_classes, **result.as_dict()}
    out_dir = Path(out) if out else default_out_dir(weights, features.weights_file)
    out_dir.mkdir(parents=True, exist_ok=True)
    png = plot_fewshot(result.shots, [result.mean(n) for n in result.shots],
                       [result.std(n) for n in result.shots], out_dir / "fewshot.png",
                       f"{features.data}: few-shot linear (l2={l2_reg:g}, {seeds} seeds)")
    lines = [_header(features), f"few-shot linear evaluation (ridge regression, l2={l2_reg:g}, "
             f"{seeds} seed(s), mean ± std over seeds):", result.table(), f"wrote {png}"]
    written = _write_json(json_path, report)
    if written:
        lines.append(f"wrote {written}")
    return "\n".join(lines), report


def probe_report(weights: str | Path, data: str | None = None, data_dir: str | None = None,
                 k: int = KNN_K, temperature: float = KNN_TEMPERATURE,
                 json_path: str | Path | None = None, weights_dir: str | Path | None = None
                 ) -> tuple[str, dict[str, Any]]:
    """Linear-probe and weighted-kNN accuracy on the frozen features: (text, report)."""
    features = frozen_features(weights, data, data_dir, weights_dir)
    args = (features.train_x, features.train_y, features.test_x, features.test_y,
            features.num_classes)
    probe = linear_probe(*args)
    knn = knn_accuracy(*args, k=k, temperature=temperature)
    report = {"weights": str(weights), "data": features.data,
              "representation": features.representation, "train_images":
              len(features.train_y), "test_images": len(features.test_y),
              "classes": features.num_classes, "linear_probe": probe.as_dict(),
              "knn": {"accuracy": knn, "k": k, "temperature": temperature}}
    grid = ", ".join(f"{wd:g}: {100 * acc:.2f}%" for wd, acc in probe.heldout_accuracy.items())
    lines = [_header(features),
             f"linear probe: weight decay by held-out 10% of train: {grid}",
             f"  chosen weight decay {probe.weight_decay:g}; test accuracy "
             f"{100 * probe.accuracy:.2f}%",
             f"kNN (k={k}, T={temperature:g}, cosine): test accuracy {100 * knn:.2f}%"]
    written = _write_json(json_path, report)
    if written:
        lines.append(f"wrote {written}")
    return "\n".join(lines), report

