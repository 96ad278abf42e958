"""The confusion-matrix figure of `vitkit eval` stays a readable size whatever the head: it
draws the classes the data holds and those predicted, and a confusion of a thousand
classes is one unlabelled figure."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from PIL import Image

import vitkit
from vitkit.analysis.plots import plot_confusion
from vitkit.cli import main

TINY = {"img_size": 16, "patch_size": 8, "width": 16, "depth": 1, "num_heads": 2, "mlp_dim": 32}


def _folder(root: Path, classes: list[str], splits: tuple[str, ...] = ("train", "val")) -> Path:
    for split in splits:
        for k, name in enumerate(classes):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(3):
                Image.new("RGB", (16, 16), (70 * k + 5 * i, 30, 200 - 60 * k)).save(
                    root / split / name / f"{i}.png")
    return root


def test_eval_of_a_many_class_model_draws_the_classes_seen(tmp_path):
    """45 px per model class would make a 200-class figure 9,200 px square (4 GB)."""
    model = vitkit.create_model({**TINY, "num_classes": 200})
    weights = vitkit.save_pretrained(model, tmp_path / "many")
    data = _folder(tmp_path / "three", ["class 0", "class 1", "class 2"], ("val",))
    assert main(["eval", str(weights), "--data", "folder", "--data-dir", str(data), "--out",
                 str(tmp_path / "report")]) == 0
    report = json.loads((tmp_path / "report" / "eval.json").read_text())
    with Image.open(tmp_path / "report" / "confusion_matrix.png") as png:
        side = max(png.size)
    assert report["images"] == 9
    assert side <= 100 * (0.45 * (3 + 9) + 2)  # 3 true classes and at most 9 predicted


def test_a_confusion_of_every_one_of_1000_classes_is_one_unlabelled_figure(tmp_path):
    confusion = torch.eye(1000, dtype=torch.long) * 3
    png = plot_confusion(confusion, [f"c{i}" for i in range(1000)], tmp_path / "c.png")
    with Image.open(png) as image:
        assert max(image.size) <= 1200
