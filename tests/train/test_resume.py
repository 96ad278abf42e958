"""Resuming a run: `--resume` takes a run folder or its last.pt; a resume that changes
batch_size, train_limit or the data's size trains the epochs asked (counted from the
checkpoint's position in its own batches), a resume within an epoch keeps the batches that
epoch began with (and says so, with the setting that works), and a resume with another
recipe names the model mismatch."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from vitkit.cli import main
from vitkit.train.checkpoint import load_state


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


TINY = ['model={"img_size": 8, "patch_size": 4, "in_chans": 1, "width": 16, "depth": 1, '
        '"num_heads": 2, "mlp_dim": 32}', "progress=false", "warmup_epochs=0"]


ARRAYS = ['model={"img_size": 16, "patch_size": 4, "width": 16, "depth": 1, "num_heads": 2, '
          '"mlp_dim": 32}', "total_steps=2", "batch_size=16", "warmup_steps=0", "progress=false"]


def _position(run: Path) -> dict:
    return torch.load(run / "last.pt", weights_only=True)["position"]


def _arrays(folder: Path, train_targets: np.ndarray, test_targets: np.ndarray) -> Path:
    rng = np.random.default_rng(0)
    folder.mkdir()
    for split, targets in (("train", train_targets), ("test", test_targets)):
        np.savez(folder / f"{split}.npz", targets=targets,
                 images=rng.random((len(targets), 16, 16), dtype=np.float32))
    return folder


def test_a_resume_with_another_batch_size_trains_the_epochs_asked(tmp_path):
    """2 epochs of 4 batches of 32, then epochs=3 at batch 16: one epoch of 8 batches more
    (not 3 x 8 = 24 steps from step 8, which would end at epoch 4)."""
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
    says(capsys.readouterr().err, "within epoch 2", "batch 2", "batches it began with",
         "resume with batch_size=32")
    # the advice followed; accum_steps splits the same batches, so it may change mid-epoch
    assert main([*resume, "batch_size=32", "accum_steps=2"]) == 0
    assert _position(run)["step"] == 8


def test_a_resume_with_another_train_limit_trains_the_epochs_asked(tmp_path):
    """1 epoch of 2 batches (train_limit=64), then epochs=2 over 128 images: one epoch of 4
    batches more (not 2 x 4 = 8 steps from step 2, which would end at epoch 2.5)."""
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
    says(capsys.readouterr().err, "within epoch 1", "batch 3", "batches it began with",
         "resume with train_limit=128")
    assert main([*resume, "train_limit=128"]) == 0  # the advice followed
    assert _position(run)["step"] == 5


def test_resume_takes_a_run_folder(tmp_path):
    out = tmp_path / "run"
    assert main(["train", "digits", "total_steps=2", "warmup_steps=1", "progress=false",
                 "--out", str(out)]) == 0
    assert main(["train", "--resume", str(out), "total_steps=3"]) == 0
    assert load_state(out / "last.pt")["position"]["step"] == 3


def test_resuming_with_another_recipe_names_the_model_not_the_warmup(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "digits", "epochs=1", "warmup_epochs=0.5", "model.depth=2",
                 "batch_size=256", "progress=false", "--out", str(out)]) == 0
    # The digits recipe's warmup_epochs=2 is longer than epochs=1, but the model is the problem.
    assert main(["train", "digits", "epochs=1", "--resume", str(out / "last.pt")]) == 2
    err = capsys.readouterr().err
    says(err, "another model config", "depth", "checkpoint 2", "config 4")
    assert "warmup" not in err
    assert main(["train", "epochs=2", "--resume", str(out / "last.pt")]) == 0  # the advice
