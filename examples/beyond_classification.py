"""Regression on scientific fields and multi-label pictures, against simple baselines.

Makes two synthetic sets, trains a small ViT on each with `vitkit train data=arrays`, evaluates
it with `vitkit eval`, and prints its scores beside two baselines computed here:

- fields: 1x32x32 float fields, each two Gaussian bumps (random height, width and place) on a
  tilted background with noise. Targets: `peak` (the highest value of the clean field) and
  `separation` (the distance between the bump centres, in pixels). Metric: R^2 (mean over the
  two targets; per target too). Baselines: predict the training mean (R^2 ~ 0) and ridge
  regression on the pixels (its penalty picked on a held-out part of the training set).
- shapes: 3x32x32 8-bit pictures holding any of a disk, a square and a bar, each present with
  probability 0.4, at random places and colours on a noisy background. Metric: mAP (macro
  average precision). Baselines: every image scored by the label's training frequency (mAP =
  the positives' share) and ridge regression on the pixels, one output per label.

Run from the repository root; minutes on two CPU cores:

    python examples/beyond_classification.py            # writes under runs/beyond
    python examples/beyond_classification.py --epochs 2 --train 512   # a quick look
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from vitkit.runtime import cpu_description
from vitkit.tasks import TaskSpec, make_task

SIZE = 32
MODEL = {"img_size": [SIZE, SIZE], "patch_size": 4, "width": 96, "depth": 4, "num_heads": 4,
         "mlp_dim": 192}


def make_fields(count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Fields (N, 1, 32, 32) float32 and targets (N, 2): peak, separation."""
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)
    fields = np.empty((count, 1, SIZE, SIZE), np.float32)
    targets = np.empty((count, 2), np.float32)
    for i in range(count):
        centres = rng.uniform(5, SIZE - 5, size=(2, 2))
        heights = rng.uniform(0.5, 2.0, size=2)
        widths = rng.uniform(1.5, 4.0, size=2)
        clean = sum(h * np.exp(-((yy - c[0]) ** 2 + (xx - c[1]) ** 2) / (2 * w ** 2))
                    for c, h, w in zip(centres, heights, widths, strict=True))
        tilt = rng.normal(0, 0.01, size=2)
        background = tilt[0] * (yy - SIZE / 2) + tilt[1] * (xx - SIZE / 2)
        fields[i, 0] = clean + background + rng.normal(0, 0.05, size=(SIZE, SIZE))
        targets[i] = clean.max(), np.linalg.norm(centres[0] - centres[1])
    return fields, targets


def make_shapes(count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Pictures (N, 3, 32, 32) uint8 and 0/1 labels (N, 3): disk, square, bar."""
    yy, xx = np.mgrid[0:SIZE, 0:SIZE]
    images = rng.integers(0, 60, size=(count, 3, SIZE, SIZE)).astype(np.float32)
    labels = (rng.random((count, 3)) < 0.4).astype(np.float32)
    for i in range(count):
        for kind in np.flatnonzero(labels[i]):
            cy, cx = rng.integers(6, SIZE - 6, size=2)
            if kind == 0:
                mask = (yy - cy) ** 2 + (xx - cx) ** 2 <= 16
            elif kind == 1:
                mask = (abs(yy - cy) <= 3) & (abs(xx - cx) <= 3)
            else:
                mask = (abs(yy - cy) <= 1) & (abs(xx - cx) <= 6)
            colour = rng.integers(120, 256, size=3)
            images[i][:, mask] = colour[:, None]
    return images.clip(0, 255).astype(np.uint8), labels


def write_set(folder: Path, make, train: int, test: int, seed: int, names: list[str]
              ) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for split, count in (("train", train), ("test", test)):
        images, targets = make(count, rng)
        np.savez(folder / f"{split}.npz", images=images, targets=targets,
                 target_names=np.array(names))
        arrays[f"{split}_images"], arrays[f"{split}_targets"] = images, targets
    return arrays


def ridge_predictions(arrays: dict[str, np.ndarray]) -> np.ndarray:
    """Ridge regression on standardised pixels; the penalty picked on the last fifth of the
    training set, then refit on all of it."""
    x = arrays["train_images"].reshape(len(arrays["train_images"]), -1).astype(np.float64)
    t = arrays["test_images"].reshape(len(arrays["test_images"]), -1).astype(np.float64)
    mean, std = x.mean(0), x.std(0) + 1e-8
    x, t = (x - mean) / std, (t - mean) / std
    y = arrays["train_targets"].astype(np.float64)

    def fit(features: np.ndarray, targets: np.ndarray, alpha: float) -> np.ndarray:
        ones = np.hstack([features, np.ones((len(features), 1))])
        gram = ones.T @ ones + alpha * np.eye(ones.shape[1])
        return np.linalg.solve(gram, ones.T @ targets)

    def apply(features: np.ndarray, weights: np.ndarray) -> np.ndarray:
        return np.hstack([features, np.ones((len(features), 1))]) @ weights

    cut = len(x) * 4 // 5
    errors = {alpha: ((apply(x[cut:], fit(x[:cut], y[:cut], alpha)) - y[cut:]) ** 2).mean()
              for alpha in (0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0)}
    return apply(t, fit(x, y, min(errors, key=errors.get)))


def scores(kind: str, predictions: np.ndarray, targets: np.ndarray) -> dict:
    """The task's metrics (vitkit.tasks: as scikit-learn computes them) of plain predictions:
    values for regression; for multilabel, scores whose 0.5 is the decision threshold (they
    are shifted to logits: AP needs only their order, F1 the side of 0.5)."""
    outputs = torch.tensor(np.asarray(predictions), dtype=torch.float32)
    if kind == "multilabel":
        outputs = outputs - 0.5
    return make_task(TaskSpec(kind)).metrics(outputs, torch.tensor(targets))


def train_and_evaluate(data: Path, task: str, out: Path, epochs: int) -> tuple[dict, float]:
    model = json.dumps(MODEL, separators=(",", ":"))
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "vitkit.cli", "train", "data=arrays",
                    f"data_dir={data}", f"task={task}", f"model={model}", f"epochs={epochs}",
                    "batch_size=128", "progress=false", "--out", str(out), "--overwrite"],
                   check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    subprocess.run([sys.executable, "-m", "vitkit.cli", "eval", str(out), "--out",
                    str(out / "eval")], check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "eval" / "eval.json").read_text()), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/beyond", help="folder for the data and runs")
    parser.add_argument("--train", type=int, default=4000, help="training images per set")
    parser.add_argument("--test", type=int, default=1000, help="held-out images per set")
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args()
    out = Path(args.out)
    print(cpu_description())
    fields = write_set(out / "fields", make_fields, args.train, args.test, 0,
                       ["peak", "separation"])
    shapes = write_set(out / "shapes", make_shapes, args.train, args.test, 1,
                       ["disk", "square", "bar"])

    vit, seconds = train_and_evaluate(out / "fields", "regression", out / "fields_vit",
                                      args.epochs)
    mean = np.broadcast_to(fields["train_targets"].mean(0), fields["test_targets"].shape)
    rows = [("ViT (vitkit)", vit, f"{seconds:.0f} s training"),
            ("predict the training mean", scores("regression", mean, fields["test_targets"]), ""),
            ("ridge on pixels", scores("regression", ridge_predictions(fields),
                                       fields["test_targets"]), "")]
    print(f"\nfields: regression of peak and separation, {args.train} training and "
          f"{args.test} held-out 1x32x32 fields")
    print(f"{'model':28s} {'R^2':>6s} {'R^2 peak':>9s} {'R^2 sep.':>9s} {'MAE':>7s}")
    for name, result, note in rows:
        per = result["per_output"]
        first, second = (per[k]["r2"] for k in list(per)[:2])
        print(f"{name:28s} {result['r2']:6.3f} {first:9.3f} {second:9.3f} "
              f"{result['mae']:7.3f}  {note}")

    vit, seconds = train_and_evaluate(out / "shapes", "multilabel", out / "shapes_vit",
                                      args.epochs)
    prevalence = np.broadcast_to(shapes["train_targets"].mean(0), shapes["test_targets"].shape)
    ridge = ridge_predictions(shapes)
    rows = [("ViT (vitkit)", vit, f"{seconds:.0f} s training"),
            ("label frequency", scores("multilabel", prevalence, shapes["test_targets"]), ""),
            ("ridge on pixels", scores("multilabel", ridge, shapes["test_targets"]), "")]
    print(f"\nshapes: multi-label disk/square/bar, {args.train} training and {args.test} "
          "held-out 3x32x32 pictures")
    print(f"{'model':28s} {'mAP':>6s} {'F1@0.5':>7s}")
    for name, result, note in rows:
        print(f"{name:28s} {result['map']:6.3f} {result['f1']:7.3f}  {note}")


if __name__ == "__main__":
    main()
