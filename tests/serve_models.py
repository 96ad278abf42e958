"""Tiny saved models and inputs for the `vitkit serve` tests: a 3-class RGB picture classifier
and a 2-target regression model trained on 1-channel arrays (16x16, patch 4: a 4x4 grid)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vitkit import create_model, save_pretrained
from vitkit.preprocess import Preprocess
from vitkit.tasks import TaskSpec

TINY = {"width": 32, "depth": 2, "num_heads": 2, "mlp_dim": 64, "patch_size": 4,
        "img_size": [16, 16], "init": "trunc_normal"}
CLASSES = ["cat", "dog", "sky"]
TARGETS = ["temperature", "pressure"]


def _randomise_head(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.head.weight.copy_(torch.randn(model.head.weight.shape, generator=generator) * 2)
        model.head.bias.copy_(torch.randn(model.head.bias.shape, generator=generator))
    return model.eval()


def save_classifier(folder: Path) -> Path:
    torch.manual_seed(0)
    model = _randomise_head(create_model({**TINY, "num_classes": 3}))
    model.preprocess = Preprocess(img_size=(16, 16))
    return save_pretrained(model, folder, class_names=CLASSES)


def save_regressor(folder: Path) -> Path:
    torch.manual_seed(1)
    model = _randomise_head(create_model({**TINY, "in_chans": 1, "num_classes": 2}))
    model.task = TaskSpec("regression", names=TARGETS, target_mean=[3.0, -1.0],
                          target_std=[2.0, 0.5])
    model.preprocess = Preprocess(img_size=(16, 16), scale=1.0, mean=(0.5,), std=(0.25,))
    return save_pretrained(model, folder)


def png_bytes(seed: int = 0, size: tuple[int, int] = (20, 24), mode: str = "RGB") -> bytes:
    rng = np.random.default_rng(seed)
    shape = (*size, 3) if mode == "RGB" else size
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(buffer, "PNG")
    return buffer.getvalue()


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def fields(count: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((count, 16, 16)).astype(np.float32)
