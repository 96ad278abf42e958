"""Targets are checked before training, in both splits: held-out class indices below 0 and
multi-label targets other than 0/1 are refused with the fix; a label never positive in
training, 0/1 targets that train as regression and constant targets (nothing to learn) are
pointed out, and the message goes once the advice is followed."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from vitkit.cli import main


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


ARRAYS = ['model={"img_size": 16, "patch_size": 4, "width": 16, "depth": 1, "num_heads": 2, '
          '"mlp_dim": 32}', "total_steps=2", "batch_size=16", "warmup_steps=0", "progress=false"]


def _arrays(folder: Path, train_targets: np.ndarray, test_targets: np.ndarray) -> Path:
    rng = np.random.default_rng(0)
    folder.mkdir()
    for split, targets in (("train", train_targets), ("test", test_targets)):
        np.savez(folder / f"{split}.npz", targets=targets,
                 images=rng.random((len(targets), 16, 16), dtype=np.float32))
    return folder


def test_a_held_out_class_index_below_0_is_refused_before_training(tmp_path, capsys):
    held = np.arange(16) % 3
    held[5] = -1
    data = _arrays(tmp_path / "a", np.arange(64) % 3, held)
    argv = ["train", "data=arrays", f"data_dir={data}", *ARRAYS, "--out", str(tmp_path / "r")]
    assert main(argv) == 2
    says(capsys.readouterr().err, "1 value(s)", "no class index", "-1", "index 5",
         "whole numbers from 0", "fix or drop those rows")
    assert not (tmp_path / "r" / "last.pt").exists()
    held[5] = 2  # the advice followed
    _arrays(tmp_path / "b", np.arange(64) % 3, held)
    assert main([*argv[:2], f"data_dir={tmp_path / 'b'}", *argv[3:]]) == 0


def test_held_out_multilabel_targets_other_than_0_and_1_are_refused(tmp_path, capsys):
    labels = (np.arange(64 * 3).reshape(64, 3) % 2).astype(np.float32)
    held = labels[:16].copy()
    held[0, 0] = 2
    data = _arrays(tmp_path / "a", labels, held)
    argv = ["train", "data=arrays", f"data_dir={data}", "task=multilabel", *ARRAYS,
            "--out", str(tmp_path / "r")]
    assert main(argv) == 2
    says(capsys.readouterr().err, "held-out targets", "task=multilabel", "(N, K)", "0 and 1")
    held[0, 0] = 1  # the advice followed: targets of 0 and 1
    _arrays(tmp_path / "b", labels, held)
    assert main([*argv[:2], f"data_dir={tmp_path / 'b'}", *argv[3:]]) == 0


def test_a_label_never_positive_in_training_is_warned_of(tmp_path, caplog):
    """Multi-label: a label no training image has only learns "absent"; it is warned of by
    its index (as classification warns of a class the training split lacks)."""
    labels = (np.arange(64 * 3).reshape(64, 3) % 2).astype(np.float32)
    labels[:, 2] = 0  # never positive in training
    held = (np.arange(16 * 3).reshape(16, 3) % 2).astype(np.float32)
    data = _arrays(tmp_path / "a", labels, held)
    argv = ["train", "data=arrays", f"data_dir={data}", "task=multilabel", *ARRAYS]
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        assert main([*argv, "--out", str(tmp_path / "r")]) == 0
    says(caplog.text, "label(s) 2", "never positive", "training split", "absent")
    labels[::2, 2] = 1  # the advice followed: training images that have it
    caplog.clear()
    data = _arrays(tmp_path / "b", labels, held)
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        assert main([*argv[:2], f"data_dir={data}", *argv[3:], "--out",
                     str(tmp_path / "r2")]) == 0
    assert "never positive" not in caplog.text


MODEL = "model=" + json.dumps({"width": 16, "depth": 1, "num_heads": 2, "mlp_dim": 32,
                               "patch_size": 4, "img_size": [16, 16]})


QUICK = ["epochs=1", "warmup_epochs=0", "batch_size=32", "progress=false"]


def _both_splits(folder: Path, images: np.ndarray, targets: np.ndarray) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        np.savez(folder / f"{split}.npz", images=images, targets=targets)
    return folder


def _train(args: list[str], out: Path) -> int:
    return main(["train", MODEL, *QUICK, *args, "--out", str(out)])


def test_zero_one_targets_train_as_regression_with_a_pointer_to_the_task(tmp_path, caplog):
    rng = np.random.default_rng(3)
    images = rng.random((40, 16, 16), dtype=np.float32)
    labels = (rng.random((40, 3)) > 0.5).astype(np.float32)
    folder = _both_splits(tmp_path / "labels", images, labels)
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        assert _train(["data=arrays", f"data_dir={folder}"], tmp_path / "r0") == 0
    says(caplog.text, "all 0 or 1", "regression", "multi-label", "set task=multilabel")
    warning = "all 0 or 1"
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="vitkit"):
        assert _train(["data=arrays", f"data_dir={folder}", "task=multilabel"],
                      tmp_path / "r1") == 0
    assert warning not in caplog.text and "task=multilabel" in caplog.text


def test_a_constant_target_column_is_pointed_out(tmp_path, caplog):
    rng = np.random.default_rng(4)
    targets = np.stack([rng.random(40), np.full(40, 3.0)], axis=1)
    folder = _both_splits(tmp_path / "const", rng.random((40, 16, 16), dtype=np.float32), targets)
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        assert _train(["data=arrays", f"data_dir={folder}"], tmp_path / "r") == 0
    says(caplog.text, "column(s) 1", "always 3", "never change", "nothing to learn")
    assert "column(s) 0" not in caplog.text


def test_constant_targets_are_pointed_out_and_one_sample_is_not(tmp_path, caplog):
    rng = np.random.default_rng(5)
    folder = _both_splits(tmp_path / "all3", rng.random((40, 16, 16), dtype=np.float32),
                     np.full(40, 3.0))
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        assert _train(["data=arrays", f"data_dir={folder}"], tmp_path / "r") == 0
    says(caplog.text, "all 3", "nothing to learn", "check the targets file")
    from vitkit.tasks import infer_task

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        infer_task(np.array([[0.5, 2.0]]))  # a train_limit of 1: nothing varies, no warning
    assert caplog.text == ""
