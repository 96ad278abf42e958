"""Numeric traps are warned of before training, each naming the problem and its fix: a few
extreme values that would set the per-channel mean and std float arrays normalise with, a
learning rate of 0, and a regression target column that never changes (named by its name).
Following each fix makes the warning go."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from tests.messages import says

from vitkit.cli import main
from vitkit.data.dataset import channel_stats_of

SMALL = ["data=arrays", "model.depth=1", "model.width=16", "model.num_heads=2",
         "model.mlp_dim=32", "model.patch_size=4", "model.img_size=8", "epochs=1",
         "batch_size=16", "warmup_epochs=0", "progress=false"]


def _arrays(root: Path, images: np.ndarray, targets: np.ndarray, **extra) -> Path:
    root.mkdir(parents=True)
    for split in ("train", "test"):
        np.savez(root / f"{split}.npz", images=images, targets=targets, **extra)
    return root


def _train(tmp_path: Path, caplog, data: Path, *args: str, out: str = "run") -> str:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        assert main(["train", *SMALL, f"data_dir={data}", *args, "--out",
                     str(tmp_path / out)]) == 0
    return caplog.text


def test_one_huge_value_among_arrays_is_named_before_its_statistics_are_used(caplog) -> None:
    """One 3e38 among 256 arrays would make the stored mean about 1e34: the warning names the
    image, the value and the fixes."""
    images = np.random.default_rng(0).random((256, 1, 8, 8), dtype=np.float32)
    images[37, 0, 2, 3] = 3e38
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        mean, _ = channel_stats_of([images[:100], images[100:]], "train.npz")
    assert mean[0] > 1e30
    says(caplog.text, "train.npz", "image 37", "3e+38", "clip", "mean=", "std=")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        channel_stats_of([np.clip(images, 0, 1)], "train.npz")
    assert "image 37" not in caplog.text


@pytest.mark.parametrize("sparse", [False, True])
def test_ordinary_arrays_are_not_warned_of(caplog, sparse: bool) -> None:
    """Heavy tails and mostly-zero arrays are data, not traps."""
    rng = np.random.default_rng(1)
    images = rng.standard_cauchy((64, 2, 8, 8)).astype(np.float32) if not sparse else \
        (rng.random((64, 2, 8, 8)) > 0.9995).astype(np.float32) * 50
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        channel_stats_of([images], "x")
    assert "warning" not in caplog.text


@pytest.mark.parametrize("mode", ["memory", "stream"])
def test_training_on_arrays_with_a_huge_value_warns_and_the_fixes_quiet_it(tmp_path, caplog,
                                                                           mode: str) -> None:
    rng = np.random.default_rng(0)
    images = rng.random((32, 8, 8), dtype=np.float32)
    images[5, 1, 1] = 1e8  # a value meant, in the data's units: given statistics train
    targets = np.arange(32) % 2
    read = f"data_mode={mode}"
    text = _train(tmp_path, caplog, _arrays(tmp_path / "d", images, targets), read)
    says(text, "image 5", "1e+08", "learns nothing", "clip", "mean=... std=...")
    assert text.count("learns nothing") == 1
    clipped = _arrays(tmp_path / "clipped", np.clip(images, 0, 1), targets)
    assert "learns nothing" not in _train(tmp_path, caplog, clipped, read, out="r1")
    given = _train(tmp_path, caplog, tmp_path / "d", read, "mean=[0.5]", "std=[0.3]", out="r2")
    assert "learns nothing" not in given


def test_a_learning_rate_of_zero_is_warned_of_and_lr_above_zero_is_not(tmp_path,
                                                                       caplog) -> None:
    images = np.random.default_rng(0).random((32, 8, 8), dtype=np.float32)
    data = _arrays(tmp_path / "d", images, np.arange(32) % 2)
    says(_train(tmp_path, caplog, data, "lr=0"), "lr=0", "never change", "at chance",
         "lr=0.001")
    assert "lr=0" not in _train(tmp_path, caplog, data, "lr=0.001", out="r1")


def test_a_constant_regression_target_is_named_by_its_column_name(tmp_path, caplog) -> None:
    rng = np.random.default_rng(0)
    images = rng.random((32, 8, 8), dtype=np.float32)
    targets = rng.random((32, 3), dtype=np.float32)
    targets[:, 1] = 4.0
    names = np.array(["height", "mass", "age"])
    data = _arrays(tmp_path / "d", images, targets, target_names=names)
    says(_train(tmp_path, caplog, data), "'mass'", "always 4", "never change", "drop them")
    targets[:, 1] = rng.random(32)
    varied = _arrays(tmp_path / "varied", images, targets, target_names=names)
    assert "never change" not in _train(tmp_path, caplog, varied, out="r1")
