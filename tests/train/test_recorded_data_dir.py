"""A run records its data folder as it was given, often relative to the folder `vitkit train`
ran in. Read from another working folder, the run still finds its data: the folder it trained
in is the run folder less its relative out_dir, else the working folder the checkpoint
recorded (an absolute out_dir, a moved run). A data folder that cannot be found is named
with where a relative path was looked for and the fix, and the fix works; so are a data
folder that is a file (data=arrays) and a missing one given with no data named. A resume that
names its recipe keeps the run's data folder; a --data-dir the run's data does not read is
refused naming the data, and weights that recorded no data folder are told the command line's
--data-dir."""

import json
import logging
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit import load_pretrained, save_pretrained
from vitkit.cli import main
from vitkit.weights.formats.train_checkpoint import data_dir_from_here


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


TINY = ('model={"variant": "Ti/4", "img_size": 16, "width": 16, "depth": 1, "num_heads": 2, '
        '"mlp_dim": 32}')
QUICK = ["epochs=1", "warmup_epochs=0", "batch_size=8", "progress=false"]


@pytest.fixture
def trained_here(tmp_path: Path, monkeypatch) -> Path:
    """tmp_path/project holds pets/ and runs/pets, trained from there with relative paths."""
    project = tmp_path / "project"
    rng = np.random.default_rng(0)
    for split, count in (("train", 8), ("val", 3)):
        for shade, name in ((40, "dark"), (215, "light")):
            folder = project / "pets" / split / name
            folder.mkdir(parents=True)
            for index in range(count):
                pixels = np.clip(shade + rng.normal(0, 20, (16, 16, 3)), 0, 255)
                Image.fromarray(pixels.astype(np.uint8)).save(folder / f"{index}.png")
    monkeypatch.chdir(project)
    assert main(["train", "data=folder", "data_dir=pets", TINY, *QUICK,
                 "--out", "runs/pets"]) == 0
    return project


def test_a_run_finds_its_relative_data_folder_from_another_working_folder(
        trained_here: Path, tmp_path: Path, monkeypatch, caplog) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    run = trained_here / "runs" / "pets"
    with caplog.at_level(logging.INFO, logger="vitkit"):
        assert main(["eval", str(run), "--out", "eval"]) == 0
    says(caplog.text, "data_dir=pets", "the folder the run trained in",
         f"read from {trained_here / 'pets'}")
    assert (elsewhere / "eval" / "eval.json").is_file()
    assert main(["explain", str(run), "--num-images", "2", "--out", "explained"]) == 0
    assert any((elsewhere / "explained").iterdir())
    assert main(["train", "--resume", str(run / "last.pt"), "epochs=2"]) == 0  # and resumes
    assert main(["probe", str(run)]) == 0


def _image_folder(root: Path, per_class: int) -> None:
    rng = np.random.default_rng(3)
    for split in ("train", "val"):
        for shade, name in ((40, "dark"), (215, "light")):
            folder = root / split / name
            folder.mkdir(parents=True)
            for index in range(per_class):
                pixels = np.clip(shade + rng.normal(0, 20, (16, 16, 3)), 0, 255)
                Image.fromarray(pixels.astype(np.uint8)).save(folder / f"{index}.png")


def test_a_same_named_folder_in_the_working_folder_is_not_taken_for_the_runs_data(
        trained_here: Path, tmp_path: Path, monkeypatch, caplog) -> None:
    """Another pets/ where eval runs: the run's own (3 val images per class) is read, a
    warning names the other and how to read it, and following it reads that one (5)."""
    elsewhere = tmp_path / "elsewhere"
    _image_folder(elsewhere / "pets", per_class=5)
    monkeypatch.chdir(elsewhere)
    run = trained_here / "runs" / "pets"
    with caplog.at_level(logging.INFO, logger="vitkit"):
        assert main(["eval", str(run), "--out", "own"]) == 0
    assert json.loads((elsewhere / "own" / "eval.json").read_text())["images"] == 6
    warning = next(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    says(warning, "data_dir=pets", f"read from {trained_here / 'pets'}", "the run trained in",
         "the working folder's pets", "another folder", "--data-dir")
    advice = re.search(r"--data-dir ([^\s)]+)", warning)
    assert advice and advice[1] == str(elsewhere / "pets")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="vitkit"):
        assert main(["eval", str(run), "--data-dir", advice[1], "--out", "other"]) == 0
        assert main(["explain", str(run), "--data-dir", "pets", "--num-images", "2",
                     "--out", "explained"]) == 0
        assert main(["train", "--resume", str(run / "last.pt"), "--data-dir", "pets",
                     "epochs=2"]) == 0
    assert json.loads((elsewhere / "other" / "eval.json").read_text())["images"] == 10
    assert "read from" not in caplog.text  # a data folder given is read as given
    assert main(["finetune", str(run), "data_dir=pets", "total_steps=1", "warmup_steps=0",
                 "batch_size=8", "accum_steps=1", "progress=false", "--out", "tuned"]) == 0
    tuned = torch.load(elsewhere / "tuned" / "last.pt", weights_only=True)
    assert tuned["train_config"]["data_dir"] == "pets"  # the override, not the run's folder
    assert "read from" not in caplog.text
    with caplog.at_level(logging.INFO, logger="vitkit"):  # serve has no data flag to name
        data_dir_from_here({"data_dir": "pets", "out_dir": "runs/pets"}, run / "best.pt",
                           data_option=None)
    says(caplog.records[-1].getMessage(), "the working folder's pets", "another folder",
         "not read")
    assert "--data-dir" not in caplog.records[-1].getMessage()


def test_the_training_folder_is_told_through_a_symlink_as_named_not_its_target(
        trained_here: Path, tmp_path: Path, monkeypatch, caplog) -> None:
    """A run reached through a symlinked runs/ is read from the folder the link is in, where
    its data is; a folder of the same name beside the link's target is not picked."""
    other = tmp_path / "other"
    (other / "pets").mkdir(parents=True)  # a same-named folder with no images
    shutil.move(trained_here / "runs", other / "runs")
    (trained_here / "runs").symlink_to(other / "runs")
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.INFO, logger="vitkit"):
        assert main(["eval", str(trained_here / "runs" / "pets")]) == 0
    assert f"read from {trained_here / 'pets'}" in caplog.text


def test_a_run_written_into_its_working_folder_finds_its_data_from_elsewhere(
        trained_here: Path, tmp_path: Path, monkeypatch) -> None:
    """out_dir=. : the run folder is the folder training ran in."""
    assert main(["train", "data=folder", "data_dir=pets", TINY, *QUICK, "--out", "."]) == 0
    monkeypatch.chdir(tmp_path)
    assert main(["eval", str(trained_here), "--out", str(tmp_path / "eval")]) == 0


def test_a_moved_run_reads_its_data_from_the_working_folder_it_recorded(
        trained_here: Path, tmp_path: Path, monkeypatch, caplog) -> None:
    """Moved out of its project, the run folder no longer tells where it trained: the
    checkpoint's recorded working folder does, also over a same-named folder where eval runs."""
    moved = tmp_path / "moved"
    shutil.move(trained_here / "runs" / "pets", moved)
    elsewhere = tmp_path / "elsewhere"
    _image_folder(elsewhere / "pets", per_class=5)
    monkeypatch.chdir(elsewhere)
    with caplog.at_level(logging.INFO, logger="vitkit"):
        assert main(["eval", str(moved), "--out", "own"]) == 0
    assert json.loads((elsewhere / "own" / "eval.json").read_text())["images"] == 6
    says(caplog.text, "data_dir=pets", f"read from {trained_here / 'pets'}",
         "the folder the run trained in")
    assert main(["train", "--resume", str(moved / "last.pt"), "epochs=2"]) == 0
    resumed = torch.load(moved / "last.pt", weights_only=True)
    assert resumed["train_config"]["data_dir"] == str(trained_here / "pets")


def test_a_copied_project_reads_its_own_data_not_the_recorded_folder(
        trained_here: Path, tmp_path: Path, monkeypatch) -> None:
    """The run folder less its out_dir comes first: a copy of the whole project (run and
    data, the copy's data changed) reads the copy's data, not the original's."""
    copy = tmp_path / "copy"
    shutil.copytree(trained_here, copy)
    for index in range(3, 5):  # two more held-out images in the copy
        shutil.copy(copy / "pets" / "val" / "dark" / "0.png",
                    copy / "pets" / "val" / "dark" / f"{index}.png")
    monkeypatch.chdir(tmp_path)
    assert main(["eval", str(copy / "runs" / "pets"), "--out", "copied"]) == 0
    assert json.loads((tmp_path / "copied" / "eval.json").read_text())["images"] == 8


def test_a_run_with_an_absolute_out_dir_reads_its_relative_data_from_elsewhere(
        trained_here: Path, tmp_path: Path, monkeypatch, caplog) -> None:
    run = tmp_path / "absolute" / "pets"
    assert main(["train", "data=folder", "data_dir=pets", TINY, *QUICK, "--out", str(run)]) == 0
    elsewhere = tmp_path / "elsewhere"
    _image_folder(elsewhere / "pets", per_class=5)
    monkeypatch.chdir(elsewhere)
    with caplog.at_level(logging.INFO, logger="vitkit"):
        assert main(["eval", str(run), "--out", "own"]) == 0
        assert main(["explain", str(run), "--num-images", "2", "--out", "explained"]) == 0
    assert json.loads((elsewhere / "own" / "eval.json").read_text())["images"] == 6
    assert f"read from {trained_here / 'pets'}" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="vitkit"):
        assert main(["probe", str(run)]) == 0
    said = [r.getMessage() for r in caplog.records if "read from" in r.getMessage()]
    assert len(said) == 1
    says(said[0], "data_dir=pets", f"read from {trained_here}")


def test_a_moved_run_names_where_its_relative_folder_was_looked_for_and_the_fix(
        trained_here: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    """Neither the run folder nor the recorded working folder holds the data any more (its
    project moved as well): the error says where a relative folder was looked for."""
    moved = tmp_path / "moved"
    shutil.move(trained_here / "runs" / "pets", moved)
    shutil.move(trained_here / "pets", trained_here / "pets-renamed")
    monkeypatch.chdir(tmp_path)
    assert main(["eval", str(moved)]) != 0
    err = capsys.readouterr().err
    says(err, "image folder pets", "does not exist", "relative path", str(tmp_path),
         "run from the folder it is relative to", "full path", "--data-dir PATH",
         "data_dir=PATH")
    assert main(["eval", str(moved), "--data-dir", str(trained_here / "pets-renamed")]) == 0
    (tmp_path / "pets").symlink_to(trained_here / "pets-renamed")
    assert main(["eval", str(moved)]) == 0  # or from the folder it is relative to


def test_an_arrays_file_given_for_the_folder_names_the_folder(tmp_path: Path, monkeypatch,
                                                             capsys) -> None:
    rng = np.random.default_rng(1)
    for split, count in (("train", 16), ("test", 8)):
        np.savez(tmp_path / f"{split}.npz", images=rng.random((count, 1, 16, 16), np.float32),
                 targets=rng.random(count, np.float32))
    monkeypatch.chdir(tmp_path)
    model = TINY.replace('"img_size"', '"in_chans": 1, "img_size"')
    assert main(["train", "data=arrays", "data_dir=train.npz", model, *QUICK,
                 "--out", "r0"]) == 2
    err = capsys.readouterr().err
    says(err, "data=arrays", "data_dir=train.npz", "is a file", "folder that holds",
         "test.npz", "images.npy", "data_dir=.")
    assert main(["train", "data=arrays", "data_dir=.", model, *QUICK, "--out", "r1"]) == 0


def test_an_arrays_file_in_a_split_folder_names_the_folder_above_the_splits(
        tmp_path: Path, capsys) -> None:
    rng = np.random.default_rng(2)
    for split, count in (("train", 16), ("test", 8)):
        (tmp_path / "data" / split).mkdir(parents=True)
        np.save(tmp_path / "data" / split / "images.npy",
                rng.random((count, 1, 16, 16), np.float32))
        np.save(tmp_path / "data" / split / "targets.npy", rng.random(count, np.float32))
    model = TINY.replace('"img_size"', '"in_chans": 1, "img_size"')
    given = tmp_path / "data" / "train" / "images.npy"
    assert main(["train", "data=arrays", f"data_dir={given}", model, *QUICK,
                 "--out", str(tmp_path / "r0")]) == 2
    fix = f"data_dir={tmp_path / 'data'}"
    says(capsys.readouterr().err, str(given), fix)
    assert main(["train", "data=arrays", fix, model, *QUICK, "--out", str(tmp_path / "r1")]) == 0


def test_a_missing_data_folder_with_no_data_named_says_it_is_missing(tmp_path: Path,
                                                                   monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--data-dir", "pets", *QUICK]) == 2
    err = capsys.readouterr().err
    says(err, "data_dir=pets", "does not exist", "relative path", str(tmp_path),
         "run from the folder it is relative to", "data=folder", "cifar10", "cifar100", "arrays")
    assert not (tmp_path / "runs").exists()
    _image_folder(tmp_path / "project" / "pets", per_class=4)  # the advice followed:
    monkeypatch.chdir(tmp_path / "project")  # run from the folder it is relative to
    assert main(["train", "--data-dir", "pets", TINY, *QUICK, "--out", str(tmp_path / "r")]) == 0


TINY_FOLDER_RUN = ['model={"img_size": 16, "patch_size": 8, "width": 16, "depth": 1, '
                   '"num_heads": 2, "mlp_dim": 32}', "epochs=1", "batch_size=4",
                   "warmup_epochs=0", "progress=false"]


def _class_folder(root: Path, classes: list[str]) -> Path:
    for split in ("train", "val"):
        for k, name in enumerate(classes):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(4):
                Image.new("RGB", (16, 16), (60 * k + i, 20, 90)).save(
                    root / split / name / f"{i}.png")
    return root


def test_a_folder_without_its_path_names_the_command_line_flag(tmp_path, capsys):
    data = _class_folder(tmp_path / "data", ["cat", "dog"])
    run = tmp_path / "run"
    assert main(["train", "data=folder", f"data_dir={data}", *TINY_FOLDER_RUN, "--out",
                 str(run)]) == 0
    weights = tmp_path / "weights"  # a model folder: no run's data recorded
    save_pretrained(load_pretrained(run), weights)
    for verb in ("eval", "explain"):
        assert main([verb, str(weights), "--data", "folder", "--out",
                     str(tmp_path / verb)]) == 2
        says(capsys.readouterr().err, "data_dir=PATH", "--data-dir PATH")
        assert main([verb, str(weights), "--data", "folder", "--data-dir", str(data), "--out",
                     str(tmp_path / verb)]) == 0  # the advice followed


def _position(run: Path) -> dict:
    return torch.load(run / "last.pt", weights_only=True)["position"]


def test_a_resume_naming_the_recipe_reads_the_runs_data_folder(tmp_path, cifar10_dir,
                                                               monkeypatch):
    """`vitkit train cifar10-tutorial epochs=2 --resume ...` of a run trained with --data-dir
    reads the run's folder, not the recipe's default place for CIFAR-10."""
    monkeypatch.delenv("VITKIT_CIFAR10_DIR", raising=False)
    run = tmp_path / "run"
    small = ["train_limit=64", "test_limit=50", "batch_size=32", "progress=false"]
    assert main(["train", "cifar10-tutorial", "epochs=1", *small, "--data-dir",
                 str(cifar10_dir), "--out", str(run)]) == 0
    assert main(["train", "cifar10-tutorial", "epochs=2", *small, "--resume",
                 str(run / "last.pt")]) == 0
    assert _position(run)["epoch"] == 2


def test_a_data_dir_the_runs_data_does_not_read_is_refused_naming_the_data(
        digits_run, tmp_path, capsys):
    folder = tmp_path / "digit_pictures"  # an image folder: 10 classes, 2 splits
    for split in ("train", "val"):
        for digit in range(10):
            (folder / split / f"d{digit}").mkdir(parents=True)
            Image.new("L", (8, 8), color=25 * digit).save(folder / split / f"d{digit}" / "a.png")
    for named in ([], ["--data", "digits"]):
        assert main(["eval", str(digits_run), "--data-dir", str(folder), *named]) == 2
        says(capsys.readouterr().err, str(folder), "data=digits reads none", "data=folder",
             "arrays", "cifar10", "cifar100", "--data", "leave the folder out")
    assert main(["explain", str(digits_run), "--data-dir", str(folder), "--out",
                 str(tmp_path / "explain")]) == 2
    assert "but data=digits reads none" in capsys.readouterr().err
    assert main(["eval", str(digits_run), "--data-dir", str(folder), "--data", "folder",
                 "--out", str(tmp_path / "eval")]) == 0
    assert "folder test, 10 images" in capsys.readouterr().out
