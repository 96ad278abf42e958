"""Evaluate a trained checkpoint: top-1, top-5, loss, per-class accuracy, confusion PNG."""

from __future__ import annotations

import json
from pathlib import Path

from vitkit.config import ViTConfig
from vitkit.data.sources import load_source
from vitkit.model.vit import VisionTransformer
from vitkit.train.checkpoint import CheckpointError, load_checkpoint
from vitkit.train.metrics import evaluate


def evaluate_checkpoint(path: str | Path, data: str | None = None, data_dir: str | None = None,
                        split: str = "test", out: str | Path | None = None,
                        limit: int | None = None, batch_size: int = 500) -> str:
    """Evaluate and write eval.json + confusion_matrix.png; returns a printable report."""
    from vitkit.analysis.plots import plot_confusion

    state = load_checkpoint(path)
    if "model_config" not in state or "model" not in state:
        raise CheckpointError(f"{path} holds no vitkit model (no model_config/model entries)")
    config = ViTConfig.from_dict(state["model_config"])
    trained = state.get("train_config", {})
    data = data or trained.get("data", "digits")
    data_dir = data_dir or trained.get("data_dir")
    train_set, test_set = load_source(data, data_dir, config.img_size, config.in_chans,
                                      limit if split == "train" else None,
                                      limit if split == "test" else None)
    dataset = train_set if split == "train" else test_set
    model = VisionTransformer(config)
    model.load_state_dict(state["model"])
    pre = state.get("preprocess", {})
    mean = tuple(pre.get("mean", (0.5,) * config.in_chans))
    std = tuple(pre.get("std", (0.5,) * config.in_chans))
    result = evaluate(model, dataset, config.num_classes, mean, std, batch_size,
                      image_size=config.img_size)
    classes = list(state.get("classes") or dataset.classes)
    out_dir = Path(out) if out else Path(path).parent
    out_dir.mkdir(parents=True, exist_ok=True)
    per_class = {name: round(float(acc), 4) for name, acc in zip(classes, result.per_class,
                                                                 strict=False)}
    report = {"checkpoint": str(path), "data": data, "split": split, "images": result.count,
              "top1": result.top1, "top5": result.top5, "loss": result.loss,
              "per_class_accuracy": per_class, "confusion": result.confusion.tolist()}
    (out_dir / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    png = plot_confusion(result.confusion, classes, out_dir / "confusion_matrix.png",
                         f"{data} {split}: top-1 {100 * result.top1:.2f}%")
    lines = [f"{data} {split}, {result.count} images: top-1 {100 * result.top1:.2f}%, "
             f"top-5 {100 * result.top5:.2f}%, loss {result.loss:.4f}", "per-class accuracy:"]
    lines += [f"  {name:<12} {100 * acc:6.2f}%" for name, acc in per_class.items()]
    lines.append(f"wrote {out_dir / 'eval.json'} and {png}")
    return "\n".join(lines)
