"""Edges a black-box trial of training and evaluation found, each refused or handled with the
advice followed: a one-class folder trained to a meaningless 100%; --overwrite kept the
earlier run's eval reports beside the new weights, and an eval of --limit N replaced the whole
split's report; Ctrl-C outside training ended in a raw
KeyboardInterrupt traceback; probe and fewshot read only the run's first train_limit images
without a word; a folder without --data-dir was told to set data_dir=, which the verbs
other than train do not take."""

import json
import logging
from pathlib import Path

from PIL import Image

import vitkit.summary
from vitkit import load_pretrained, save_pretrained
from vitkit.cli import main

TINY = ['model={"img_size": 16, "patch_size": 8, "width": 16, "depth": 1, "num_heads": 2, '
        '"mlp_dim": 32}', "epochs=1", "batch_size=4", "warmup_epochs=0", "progress=false"]


def _folder(root: Path, classes: list[str]) -> Path:
    for split in ("train", "val"):
        for k, name in enumerate(classes):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(4):
                Image.new("RGB", (16, 16), (60 * k + i, 20, 90)).save(
                    root / split / name / f"{i}.png")
    return root


def test_a_one_class_folder_is_refused_and_a_second_class_trains(tmp_path, capsys):
    data = _folder(tmp_path / "data", ["cat"])
    assert main(["train", "data=folder", f"data_dir={data}", *TINY, "--out",
                 str(tmp_path / "run")]) == 2
    assert f"{data} holds one class (cat), and a classifier needs two or more: give the data " \
        "two classes or more (a folder: one sub-folder per class in train/ and in val/" \
        in capsys.readouterr().err
    _folder(data, ["cat", "dog"])  # the advice followed
    assert main(["train", "data=folder", f"data_dir={data}", *TINY, "--out",
                 str(tmp_path / "run")]) == 0


def test_overwrite_deletes_the_earlier_runs_eval_reports(tmp_path):
    data = _folder(tmp_path / "data", ["cat", "dog"])
    run = tmp_path / "run"
    assert main(["train", "data=folder", f"data_dir={data}", *TINY, "--out", str(run)]) == 0
    assert main(["eval", str(run)]) == 0
    assert main(["eval", str(run), "--limit", "3"]) == 0  # kept apart from the whole split's
    assert json.loads((run / "eval-folder-test-first3.json").read_text())["images"] == 3
    assert json.loads((run / "eval-folder-test.json").read_text())["images"] == 8
    reports = ["eval.json", "eval-folder-test.json", "eval-folder-test-first3.json",
               "confusion_matrix.png"]
    assert all((run / name).is_file() for name in reports)
    (run / "notes.txt").write_text("mine")  # not a run's file: kept
    assert main(["train", "data=folder", f"data_dir={data}", *TINY, "--out", str(run),
                 "--overwrite"]) == 0
    assert not any((run / name).exists() for name in reports)
    assert (run / "notes.txt").read_text() == "mine" and (run / "last.pt").is_file()


def test_ctrl_c_outside_training_is_one_line_and_exit_130(monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(vitkit.summary, "summarize", interrupted)
    assert main(["summary", "Ti/16"]) == 130
    assert capsys.readouterr().err == "vitkit summary: interrupted\n"


def test_probe_says_it_reads_the_runs_image_limit_and_naming_the_data_reads_all(
        tmp_path, caplog, capsys):
    run = tmp_path / "run"
    assert main(["train", "train_limit=64", "test_limit=40", *TINY[1:], 'model={"img_size": 8, '
                 '"patch_size": 4, "width": 16, "depth": 1, "num_heads": 2, "mlp_dim": 32, '
                 '"in_chans": 1}', "--out", str(run)]) == 0
    with caplog.at_level(logging.INFO, logger="vitkit"):
        assert main(["probe", str(run), "--json", str(tmp_path / "limited.json")]) == 0
    assert "train: the first 64 images, as the training run read them (its train_limit); " \
        "name the data (--data digits) to read every image" in caplog.text
    assert json.loads((tmp_path / "limited.json").read_text())["train_images"] == 64
    assert main(["probe", str(run), "--data", "digits", "--json",
                 str(tmp_path / "all.json")]) == 0  # the advice followed
    assert json.loads((tmp_path / "all.json").read_text())["train_images"] > 64
    # eval: the run's first 40 held-out images and every one, each in a report of its own
    assert main(["eval", str(run)]) == 0 and main(["eval", str(run), "--limit", "all"]) == 0
    assert json.loads((run / "eval-digits-test-first40.json").read_text())["images"] == 40
    assert json.loads((run / "eval-digits-test.json").read_text())["images"] > 40


def test_a_folder_without_its_path_names_the_command_line_flag(tmp_path, capsys):
    data = _folder(tmp_path / "data", ["cat", "dog"])
    run = tmp_path / "run"
    assert main(["train", "data=folder", f"data_dir={data}", *TINY, "--out", str(run)]) == 0
    weights = tmp_path / "weights"  # a model folder: no run's data recorded
    save_pretrained(load_pretrained(run), weights)
    for verb in ("eval", "explain"):
        assert main([verb, str(weights), "--data", "folder", "--out",
                     str(tmp_path / verb)]) == 2
        assert "data_dir=PATH in training settings, --data-dir PATH on the command line" in \
            capsys.readouterr().err
        assert main([verb, str(weights), "--data", "folder", "--data-dir", str(data), "--out",
                     str(tmp_path / verb)]) == 0  # the advice followed
