"""Edges a black-box trial of regression, multi-label and resuming found, each fixed and, where
a message gives advice, the advice followed: regression from pictures took the default flip
and crop, which move a position target (a blob's x position trained to R^2 -0.03); resuming
with another batch_size counted the epochs done in the new batches (asked for 3 epochs, it
trained to epoch 4); held-out class indices below 0 and multi-label targets other than 0/1
were only found at the first evaluation (a raw IndexError) or scored silently; `probe --json`
and `fewshot --json` wrote their report over a checkpoint; a resume naming its recipe lost the
run's data folder; patch sizes a conv stem cannot take were suggested, and 16-bit arrays were
told to be scaled as values in [0, 1]."""

from __future__ import annotations

import argparse
import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import vitkit
from vitkit.arguments import output_file
from vitkit.cli import main
from vitkit.cli.benchmark import FIGURE_SUFFIXES
from vitkit.config import ViTConfig
from vitkit.errors import ConfigError
from vitkit.tasks import TaskSpec
from vitkit.train.config import load_train_config
from vitkit.train.data import augment_config

TINY = ['model={"img_size": 8, "patch_size": 4, "in_chans": 1, "width": 16, "depth": 1, '
        '"num_heads": 2, "mlp_dim": 32}', "progress=false", "warmup_epochs=0"]
ARRAYS = ['model={"img_size": 16, "patch_size": 4, "width": 16, "depth": 1, "num_heads": 2, '
          '"mlp_dim": 32}', "total_steps=2", "batch_size=16", "warmup_steps=0", "progress=false"]


def _position(run: Path) -> dict:
    return torch.load(run / "last.pt", weights_only=True)["position"]


# -- augmentation by task ----------------------------------------------------------------------
def test_regression_on_pictures_leaves_flip_and_crop_off_unless_set(caplog):
    regression, classes = TaskSpec("regression"), TaskSpec("classification")
    plain = load_train_config(None, ["data=folder"])  # TrainConfig's defaults
    with caplog.at_level(logging.INFO):
        augment = augment_config(plain, streamed=False, task=regression)
    assert not augment.flip and augment.crop_padding == 0
    assert "task=regression: augment.flip and augment.crop_padding off" in caplog.text
    asked = load_train_config(None, ["data=folder", "augment.flip=true",
                                     "augment.crop_padding=4"])
    augment = augment_config(asked, streamed=False, task=regression)
    assert augment.flip and augment.crop_padding == 4  # the advice followed
    augment = augment_config(plain, streamed=False, task=classes)
    assert augment.flip and augment.crop_padding == 4  # classification keeps its defaults
    tuning = load_train_config("finetune", ["data=folder", "init_from=weights"])
    augment_config(tuning, streamed=False, task=regression)  # the recipe flips and crops
    assert "task=regression with augment.flip=true, resize_crop=1.33 (set by the recipe or " \
        "by you)" in caplog.text


def test_regression_on_float_arrays_warns_of_the_recipes_flip_and_zoomed_crop(caplog):
    """Fine-tuning a regression on arrays took the finetune recipe's flip and resize_crop
    without a word (a blob's x position: R^2 0.004, 0.64 without the flip, 0.88 without
    both); pictures warned. Now arrays warn alike, naming only what applies to them."""
    regression = TaskSpec("regression")
    tuning = load_train_config("finetune", ["data=arrays", "init_from=weights"])
    with caplog.at_level(logging.INFO):
        augment = augment_config(tuning, streamed=False, task=regression, float_images=True)
    assert augment.flip and augment.crop_padding == 0
    assert "task=regression with augment.flip=true, resize_crop=1.33 (set by the recipe or " \
        "by you)" in caplog.text
    advice = re.search(r"where they do, set (.*)$", caplog.text, re.MULTILINE).group(1)
    assert advice == "augment.flip=false and resize_crop=1"  # no crop padding for arrays
    caplog.clear()
    followed = load_train_config("finetune", ["data=arrays", "init_from=weights",
                                              *advice.split(" and ")])
    with caplog.at_level(logging.INFO):
        augment = augment_config(followed, streamed=False, task=regression, float_images=True)
    assert not augment.flip and "warning" not in caplog.text
    plain = load_train_config(None, ["data=arrays"])
    with caplog.at_level(logging.INFO):
        augment_config(plain, streamed=False, task=regression, float_images=True)
    assert "task=regression: augment.flip off" in caplog.text
    assert "set augment.flip=true where" in caplog.text


# -- resuming with another batch ---------------------------------------------------------------
def test_a_resume_with_another_batch_size_trains_the_epochs_asked(tmp_path):
    """2 epochs of 4 batches of 32, then epochs=3 at batch 16: one epoch of 8 batches more.
    Before: 3 x 8 = 24 steps planned from step 8, so the run ended at epoch 4."""
    run = tmp_path / "run"
    assert main(["train", *TINY, "epochs=2", "batch_size=32", "train_limit=128",
                 "test_limit=64", "--out", str(run)]) == 0
    assert main(["train", "epochs=3", "batch_size=16", "--resume", str(run / "last.pt")]) == 0
    position = _position(run)
    assert (position["epoch"], position["step"], position["total_steps"]) == (3, 16, 16)


def test_a_resume_within_an_epoch_keeps_its_batch_and_the_advice_works(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *TINY, "total_steps=6", "batch_size=32", "train_limit=128",
                 "test_limit=64", "--out", str(run)]) == 0
    assert (_position(run)["epoch"], _position(run)["batch"]) == (1, 2)
    resume = ["train", "total_steps=8", "--resume", str(run / "last.pt")]
    assert main([*resume, "batch_size=16"]) == 2
    assert "the checkpoint stopped within epoch 2 (after its batch 2), whose rest is read in " \
        "the batches it began with (batch_size=32): resume with batch_size=32" \
        in capsys.readouterr().err
    # the advice followed; accum_steps splits the same batches, so it may change mid-epoch
    assert main([*resume, "batch_size=32", "accum_steps=2"]) == 0
    assert _position(run)["step"] == 8


def test_a_resume_with_another_train_limit_trains_the_epochs_asked(tmp_path):
    """1 epoch of 2 batches (train_limit=64), then epochs=2 over 128 images: one epoch of 4
    batches more. Before: 2 x 4 = 8 steps planned from step 2, so the run ended at 2.5."""
    run = tmp_path / "run"
    assert main(["train", *TINY, "epochs=1", "batch_size=32", "train_limit=64",
                 "test_limit=64", "--out", str(run)]) == 0
    assert main(["train", "epochs=2", "train_limit=128", "--resume", str(run / "last.pt")]) == 0
    position = _position(run)
    assert (position["epoch"], position["step"], position["total_steps"]) == (2, 6, 6)
    # a later resume that only extends the run counts from the position, not from step 0
    assert main(["train", "epochs=3", "--resume", str(run / "last.pt")]) == 0
    position = _position(run)
    assert (position["epoch"], position["step"], position["total_steps"]) == (3, 10, 10)


def test_a_resume_over_data_that_gained_images_counts_the_epochs_left_in_its_batches(
        tmp_path, caplog):
    rng = np.random.default_rng(1)
    data = _arrays(tmp_path / "data", rng.integers(0, 3, 32), np.arange(16) % 3)
    config = [ARRAYS[0], "batch_size=16", "warmup_steps=0", "progress=false",
              "data=arrays", f"data_dir={data}"]
    run = tmp_path / "run"
    assert main(["train", *config, "epochs=1", "--out", str(run)]) == 0
    assert _position(run)["step"] == 2
    np.savez(data / "train.npz", targets=rng.integers(0, 3, 64),  # the data gains 32 images
             images=rng.random((64, 16, 16), dtype=np.float32))
    with caplog.at_level(logging.WARNING):
        assert main(["train", "epochs=2", "--resume", str(run / "last.pt")]) == 0
    assert "batches per epoch 2 -> 4" in caplog.text
    position = _position(run)
    assert (position["epoch"], position["step"], position["total_steps"]) == (2, 6, 6)


def test_a_resume_within_an_epoch_keeps_its_train_limit_and_the_advice_works(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *TINY, "total_steps=3", "batch_size=32", "train_limit=128",
                 "test_limit=64", "--out", str(run)]) == 0
    resume = ["train", "total_steps=5", "--resume", str(run / "last.pt")]
    assert main([*resume, "train_limit=64"]) == 2
    assert "the checkpoint stopped within epoch 1 (after its batch 3), whose rest is read in " \
        "the batches it began with (train_limit=128): resume with train_limit=128" \
        in capsys.readouterr().err
    assert main([*resume, "train_limit=128"]) == 0  # the advice followed
    assert _position(run)["step"] == 5


# -- held-out targets checked before training --------------------------------------------------
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
    assert "hold 1 value(s) that are no class index (-1, at index 5): class indices are whole " \
        "numbers from 0, as in the training split; fix or drop those rows" \
        in capsys.readouterr().err
    assert not (tmp_path / "r" / "last.pt").exists()
    held[5] = 2  # the advice followed
    _arrays(tmp_path / "b", np.arange(64) % 3, held)
    assert main([*argv[:2], f"data_dir={tmp_path / 'b'}", *argv[3:]]) == 0


def test_held_out_multilabel_targets_other_than_0_and_1_are_refused(tmp_path, capsys):
    labels = (np.arange(64 * 3).reshape(64, 3) % 2).astype(np.float32)
    held = labels[:16].copy()
    held[0, 0] = 2
    data = _arrays(tmp_path / "a", labels, held)
    assert main(["train", "data=arrays", f"data_dir={data}", "task=multilabel", *ARRAYS,
                 "--out", str(tmp_path / "r")]) == 2
    assert "the held-out targets of" in (err := capsys.readouterr().err)
    assert "task=multilabel needs (N, K) targets of 0 and 1" in err


def test_a_label_never_positive_in_training_is_warned_of(tmp_path, caplog):
    """Multi-label: a label no training image has only learns "absent" and scored AP 0 held
    out without a word (classification warns of a class the training split lacks)."""
    labels = (np.arange(64 * 3).reshape(64, 3) % 2).astype(np.float32)
    labels[:, 2] = 0  # never positive in training
    held = (np.arange(16 * 3).reshape(16, 3) % 2).astype(np.float32)
    data = _arrays(tmp_path / "a", labels, held)
    argv = ["train", "data=arrays", f"data_dir={data}", "task=multilabel", *ARRAYS]
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        assert main([*argv, "--out", str(tmp_path / "r")]) == 0
    assert "label(s) 2 are never positive in the training split, so their outputs only learn " \
        "that they are absent" in caplog.text
    labels[::2, 2] = 1  # the advice followed: training images that have it
    caplog.clear()
    data = _arrays(tmp_path / "b", labels, held)
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        assert main([*argv[:2], f"data_dir={data}", *argv[3:], "--out",
                     str(tmp_path / "r2")]) == 0
    assert "never positive" not in caplog.text


# -- reports never replace a checkpoint --------------------------------------------------------
def test_a_figure_may_replace_an_earlier_figure_of_any_format(tmp_path):
    earlier = tmp_path / "sweep.pdf"
    earlier.write_bytes(b"%PDF")
    assert output_file("sweep.png", FIGURE_SUFFIXES)(str(earlier)) == str(earlier)
    checkpoint = tmp_path / "best.pt"
    checkpoint.write_bytes(b"weights")
    with pytest.raises(argparse.ArgumentTypeError, match=r"exists and is not a \.png file"):
        output_file("sweep.png", FIGURE_SUFFIXES)(str(checkpoint))


def test_probe_json_onto_a_checkpoint_is_refused_and_a_json_path_works(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *TINY, "epochs=1", "batch_size=32", "train_limit=128",
                 "test_limit=64", "--out", str(run)]) == 0
    before = (run / "best.pt").read_bytes()
    for verb in ("probe", "fewshot"):
        with pytest.raises(SystemExit) as refused:  # argparse's usage error
            main([verb, str(run), "--json", str(run / "best.pt")])
        assert refused.value.code == 2
        assert f"{run / 'best.pt'} exists and is not a .json file: writing the report there " \
            f"would replace it; give a .json path, e.g. {run / 'report.json'}" \
            in capsys.readouterr().err
    assert (run / "best.pt").read_bytes() == before
    assert main(["probe", str(run), "--json", str(run / "report.json")]) == 0
    assert json.loads((run / "report.json").read_text())


# -- a recipe named on resume keeps the run's data folder ------------------------------------------
def test_a_resume_naming_the_recipe_reads_the_runs_data_folder(tmp_path, cifar10_dir,
                                                               monkeypatch):
    """Before: `vitkit train cifar10-tutorial epochs=2 --resume ...` of a run trained with
    --data-dir looked for CIFAR-10 in the default place and failed."""
    monkeypatch.delenv("VITKIT_CIFAR10_DIR", raising=False)
    run = tmp_path / "run"
    small = ["train_limit=64", "test_limit=50", "batch_size=32", "progress=false"]
    assert main(["train", "cifar10-tutorial", "epochs=1", *small, "--data-dir",
                 str(cifar10_dir), "--out", str(run)]) == 0
    assert main(["train", "cifar10-tutorial", "epochs=2", *small, "--resume",
                 str(run / "last.pt")]) == 0
    assert _position(run)["epoch"] == 2


# -- advice that works when followed -------------------------------------------------------------
def test_suggested_patch_sizes_are_ones_the_stem_takes():
    """Before: a conv stem (the cifar10 recipe's) at 30 px was offered 2, 3, 5, 6, 10, 15 or
    30, and each but 2 was then refused: a conv stem's patch is a power of 2."""
    conv = dict(stem="conv", stem_channels=(16, 32, 64), width=64, num_heads=2, mlp_dim=64,
                depth=1)
    with pytest.raises(ConfigError, match=r"\(patch_size 2 for 30x30\)") as refused:
        ViTConfig(img_size=30, patch_size=8, **conv)
    suggested = re.search(r"patch_size ([\d, or]+) for", str(refused.value)).group(1)
    for patch in re.findall(r"\d+", suggested):
        ViTConfig(img_size=30, patch_size=int(patch), **conv)  # each one is taken
    with pytest.raises(ConfigError, match="none above 1 does for 100x100 with this stem"):
        ViTConfig(img_size=100, patch_size=16, stem="resnet", resnet_layers=(3, 4, 9))


def test_16_bit_arrays_for_a_picture_model_get_the_conversion_that_works(tmp_path, capsys):
    weights = vitkit.save_pretrained(vitkit.create_model(
        {"img_size": 16, "patch_size": 8, "in_chans": 1, "width": 16, "depth": 1,
         "num_heads": 2, "mlp_dim": 32, "num_classes": 3}), tmp_path / "w")
    a = np.random.default_rng(0).integers(0, 65535, (2, 1, 16, 16), dtype=np.uint16)
    np.save(tmp_path / "wide.npy", a)
    assert main(["predict", str(weights), str(tmp_path / "wide.npy")]) != 0
    assert "for 16-bit values: (a >> 8).astype(numpy.uint8)" in capsys.readouterr().err
    np.save(tmp_path / "bytes.npy", (a >> 8).astype(np.uint8))  # the advice followed
    assert main(["predict", str(weights), str(tmp_path / "bytes.npy")]) == 0
