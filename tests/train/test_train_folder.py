"""Training on a class-per-folder data set: `--data-dir` alone trains on an image folder and
says so, the message for a folder that is not one describes a layout that works when followed
literally, unreadable images are named in the run folder, a head
sized to the classes found (or refused when set to another number), and fine-tuning runs
that remember the folder for `vitkit eval`."""

import logging
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitkit.cli import main
from vitkit.data.skipped import read_skipped_files
from vitkit.data.sources import open_source
from vitkit.errors import ConfigError
from vitkit.train.checkpoint import load_state
from vitkit.train.checkpoint import load_state as load_checkpoint
from vitkit.train.config import load_train_config
from vitkit.train.loop import run_loop
from vitkit.train.setup import build_run

CLASSES = 3


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


QUICK = ["data=folder", "total_steps=4", "warmup_steps=1", "batch_size=16", "progress=false"]


@pytest.fixture(scope="module")
def digit_folder(tmp_path_factory) -> Path:
    """Digits 0-2 of the embedded data as 8x8 grayscale PNGs in train/ and val/ class folders,
    plus one corrupt file in train/1."""
    root = tmp_path_factory.mktemp("folder") / "digits3"
    train, test = open_source("digits", None, (8, 8), 1)
    for split, data in (("train", train), ("val", test)):
        for i, (image, label) in enumerate(zip(data.images, data.labels, strict=True)):
            if int(label) < CLASSES:
                path = root / split / str(int(label)) / f"{i}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(image[0].numpy().astype(np.uint8)).save(path)
    (root / "train" / "1" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    return root


def test_a_folder_run_names_the_files_it_skipped(tmp_path, digit_folder):
    out = tmp_path / "run"
    cfg = load_train_config("digits", [*QUICK, f"data_dir={digit_folder}",
                                       f"model.num_classes={CLASSES}", f"out_dir={out}"])
    run_loop(build_run(cfg))
    skipped = read_skipped_files(out / "skipped_files.txt")
    assert [Path(path).name for path, _ in skipped] == ["broken.png"]
    assert skipped[0][1].startswith("corrupt: starts like a PNG")


def test_a_head_of_another_size_than_the_classes_found_is_refused(tmp_path, digit_folder,
                                                                  capsys):
    args = ["train", "digits", *QUICK, "--data-dir", str(digit_folder), "--out", str(tmp_path)]
    assert main(args) == 2  # the digits recipe's 10-way head, 3 class folders
    err = capsys.readouterr().err
    says(err, "model.num_classes=10", str(digit_folder), "3 classes")
    assert main([*args, f"model.num_classes={CLASSES}"]) == 0  # the advice works
    assert load_checkpoint(tmp_path / "last.pt")["model"]["head.weight"].shape[0] == CLASSES


def test_a_model_without_num_classes_is_sized_from_the_folder(tmp_path, digit_folder):
    model = {"variant": "Ti/2", "img_size": 8, "in_chans": 1, "width": 32, "depth": 1,
             "num_heads": 2, "mlp_dim": 64}
    cfg = load_train_config("digits", [*QUICK, f"data_dir={digit_folder}",
                                       f"out_dir={tmp_path}"])
    cfg.model = model
    trainer = build_run(cfg)
    assert trainer.model.config.num_classes == CLASSES
    with pytest.raises(ConfigError, match=r"model\.num_classes=5 but"):
        cfg.model = {**model, "num_classes": 5}
        build_run(cfg)


def test_eval_of_a_finetuned_folder_run_finds_the_folder_by_itself(tmp_path, digit_folder,
                                                                   capsys):
    pretrained = tmp_path / "pre"
    assert main(["train", "digits", "total_steps=4", "model.depth=1", "progress=false",
                 "--out", str(pretrained)]) == 0
    tuned = tmp_path / "ft"
    assert main(["finetune", str(pretrained / "last.pt"), "--data", "folder", "--data-dir",
                 str(digit_folder), "total_steps=4", "warmup_steps=1", "batch_size=16",
                 "accum_steps=1", "progress=false", "--out", str(tuned)]) == 0
    recipe = load_checkpoint(tuned / "last.pt")["train_config"]
    assert (recipe["data"], recipe["data_dir"]) == ("folder", str(digit_folder))
    capsys.readouterr()
    assert main(["eval", str(tuned)]) == 0  # no --data, no --data-dir
    out = capsys.readouterr().out
    val_images = len(list((digit_folder / "val").rglob("*.png")))
    assert str(val_images) in out and "top-1" in out


TWO_STEPS = ["total_steps=2", "warmup_steps=1", "batch_size=4", "progress=false"]


def _images(folder: Path, count: int = 4) -> None:
    """`count` 8x8 grayscale PNGs in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(len(str(folder)))
    for i in range(count):
        Image.fromarray(rng.integers(0, 255, (8, 8), dtype=np.uint8), mode="L").save(
            folder / f"{i}.png")


def _follow_layout(message: str) -> None:
    """Create every `ROOT/.../<class_name>/<image>.jpg` path the message describes, with two
    classes (`test/` stands in for val/ only when val/ is not named)."""
    for pattern in re.findall(r"([^\s(]+)/<class_name>/<image>\.jpg", message):
        for name in ("a", "b"):
            _images(Path(pattern) / name)


def _recipe(path: Path) -> dict:
    return load_state(path)["train_config"]


def test_data_dir_alone_trains_on_the_image_folder_and_says_so(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    for split in ("train", "val"):
        for name in ("cat", "dog"):
            _images(tmp_path / "images" / split / name)
    with caplog.at_level(logging.INFO, logger="vitkit.train"):
        assert main(["train", "--data-dir", "images", "model.num_classes=2", *TWO_STEPS,
                     "--out", "run"]) == 0
    assert "training on data=folder" in caplog.text
    assert _recipe(tmp_path / "run" / "last.pt")["data"] == "folder"
    head = load_state(tmp_path / "run" / "last.pt")["model"]["head.weight"]
    assert tuple(head.shape) == (2, 192)  # TrainConfig's Ti/16, not the digits recipe's model


def test_a_refused_start_leaves_nothing_and_the_corrected_retry_runs(tmp_path, monkeypatch,
                                                                     capsys):
    """A folder of 8 training images with batch 128 is refused; the same --out then takes
    the retry with a batch that fits, instead of refusing it as a run's folder."""
    monkeypatch.chdir(tmp_path)
    for split in ("train", "val"):
        for name in ("cat", "dog"):
            _images(tmp_path / "images" / split / name)
    (tmp_path / "images" / "train" / "cat" / "broken.png").write_bytes(b"not a png")
    small = ['model={"img_size": 8, "patch_size": 4, "in_chans": 1, "width": 16, "depth": 1, '
             '"num_heads": 2, "mlp_dim": 32}', "total_steps=2", "warmup_steps=1",
             "progress=false"]
    args = ["train", "data=folder", "data_dir=images", *small, "--out", "runs/y1"]
    assert main([*args, "batch_size=128"]) == 2
    says(capsys.readouterr().err, "batch_size")
    assert not (tmp_path / "runs" / "y1" / "skipped_files.txt").exists()
    assert main([*args, "batch_size=4"]) == 0, capsys.readouterr().err
    assert (tmp_path / "runs" / "y1" / "last.pt").is_file()


def test_data_dir_that_is_no_image_folder_is_refused_and_the_advice_works(tmp_path, monkeypatch,
                                                                         capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").mkdir()
    assert main(["train", "--data-dir", "mine", *TWO_STEPS, "--out", "run"]) == 2
    err = capsys.readouterr().err
    assert "data=folder" in err and "data=cifar10" in err and "Traceback" not in err
    assert not (tmp_path / "run" / "last.pt").exists()  # nothing trained on the digits
    _follow_layout(err)
    assert main(["train", "--data-dir", "mine", "data=folder", "model.num_classes=2", *TWO_STEPS,
                 "--out", "run"]) == 0


def test_the_missing_image_folder_message_describes_a_layout_that_works(tmp_path, capsys):
    root = tmp_path / "photos"
    args = ["train", "data=folder", "--data-dir", str(root), "model=Ti/2",
            "model.img_size=8", "model.in_chans=1", "model.depth=1", *TWO_STEPS,
            "--out", str(tmp_path / "run")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "train/<class_name>" in err
    _follow_layout(err)  # literally: the folders the message names
    assert main(args) == 0
