"""Mistakes of a first hour found by following the docs as a newcomer: each is refused with a
message naming the problem and a fix, and the fix is then followed and runs (a patch size that
does not divide the data's images, a run folder with no checkpoint to resume, a file where a
folder is needed and the reverse, a --data-dir that the run's data does not read)."""

import json
import logging
import os
from pathlib import Path

import pytest
from PIL import Image

from vitkit.cli import main
from vitkit.data.sources.digits import load_digits

QUICK = ["epochs=1", "warmup_epochs=0", "train_limit=256", "test_limit=200", "progress=false"]


@pytest.fixture
def run(tmp_path: Path) -> Path:
    out = tmp_path / "run"
    assert main(["train", *QUICK, "--out", str(out)]) == 0
    return out


def test_a_patch_size_that_does_not_divide_the_images_names_those_that_do(tmp_path, capsys):
    assert main(["train", *QUICK, "model.patch_size=3", "--out", str(tmp_path / "r0")]) == 2
    err = capsys.readouterr().err
    assert "image size 8x8 is not divisible by patch size 3: use an image size that is a " \
        "multiple of 3 (e.g. 9x9) or a patch size that divides both sides (patch_size 2, 4 or " \
        "8 for 8x8)" in err
    assert main(["train", *QUICK, "model.patch_size=4", "--out", str(tmp_path / "r1")]) == 0


def test_a_run_folder_without_a_checkpoint_is_not_offered_for_resuming(tmp_path, capsys):
    out = tmp_path / "metrics_only"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"epoch": 1.0}\n')
    assert main(["train", *QUICK, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{out} already holds a run (metrics.jsonl); a new run there would overwrite it. It " \
        "has no last.pt to continue from. To start over (deletes those files and the eval " \
        "reports there): --overwrite" in err
    assert "--resume" not in err
    assert main(["train", *QUICK, "--out", str(out), "--overwrite"]) == 0


def test_a_file_for_a_folder_and_a_folder_for_a_file_are_named_with_the_fix(
        run, tmp_path, capsys):
    for where, shown in ((run / "best.pt", f"{run / 'best.pt'}"),
                         (run / "best.pt" / "eval", f"{run / 'best.pt' / 'eval'}: "
                                                    f"{run / 'best.pt'}")):
        with pytest.raises(SystemExit) as exited:  # refused before any work
            main(["eval", str(run), "--out", str(where)])
        err = capsys.readouterr().err
        assert exited.value.code == 2 and "Traceback" not in err
        assert f"vitkit eval: error: argument --out: {shown} is a file, where a folder is " \
            "needed: give a folder path" in err
    assert main(["eval", str(run), "--out", str(tmp_path / "eval")]) == 0
    with pytest.raises(SystemExit) as exited:
        main(["probe", str(run), "--json", str(tmp_path / "eval")])
    assert exited.value.code == 2
    assert f"vitkit probe: error: argument --json: {tmp_path / 'eval'} is a folder: give the " \
        f"file to write, e.g. {tmp_path / 'eval' / 'report.json'}" in capsys.readouterr().err
    assert main(["probe", str(run), "--json", str(tmp_path / "eval" / "report.json")]) == 0


@pytest.mark.parametrize("argv, flag, example", [
    (["probe", "W"], "--json", "report.json"),
    (["fewshot", "W"], "--json", "report.json"),
    (["benchmark", "--sweep", "--variants", "cifar10-tutorial", "--resolutions", "32",
      "--memory-gb", "1", "--batch-size", "2", "--warmup", "0", "--iters", "1"], "--out",
     "sweep.png")])
def test_a_file_path_ending_in_a_separator_is_refused_as_a_folder(
        argv, flag, example, tmp_path, capsys):
    """A file-valued output that ends in a separator names a folder, though none exists yet
    (the file was written under the folder's name): every such argument refuses it at once,
    naming a file in the folder (followed in test_benchmark_cli.py and below; export's --out,
    whose example depends on --int8, is refused by export itself: test_export.py)."""
    for folder in (f"{tmp_path / 'new'}{os.sep}", f"{tmp_path / 'new'}{os.sep}."):
        with pytest.raises(SystemExit) as exited:
            main([*argv, flag, folder])
        err = capsys.readouterr().err
        assert exited.value.code == 2 and "Traceback" not in err
        assert f"vitkit {argv[0]}: error: argument {flag}: {folder} names a folder: give the " \
            f"file to write, e.g. {tmp_path / 'new' / example}" in err
    assert list(tmp_path.iterdir()) == []


def test_a_json_report_into_a_folder_not_made_yet_follows_the_advice(run, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["probe", str(run), "--json", f"{tmp_path / 'reports'}{os.sep}"])
    assert f"e.g. {tmp_path / 'reports' / 'report.json'}" in capsys.readouterr().err
    assert not (tmp_path / "reports").exists()
    assert main(["probe", str(run), "--json", str(tmp_path / "reports" / "report.json")]) == 0
    assert (tmp_path / "reports" / "report.json").is_file()


def test_a_data_dir_the_runs_data_does_not_read_is_refused_naming_the_data(
        run, tmp_path, capsys):
    folder = tmp_path / "digit_pictures"  # an image folder: 10 classes, 2 splits
    for split in ("train", "val"):
        for digit in range(10):
            (folder / split / f"d{digit}").mkdir(parents=True)
            Image.new("L", (8, 8), color=25 * digit).save(folder / split / f"d{digit}" / "a.png")
    for named in ([], ["--data", "digits"]):
        assert main(["eval", str(run), "--data-dir", str(folder), *named]) == 2
        assert f"a data folder ({folder}) was given, but data=digits reads none: name the data " \
            "the folder holds (data=folder, arrays, cifar10 or cifar100; --data on the command " \
            "line), or leave the folder out" in capsys.readouterr().err
    assert main(["explain", str(run), "--data-dir", str(folder), "--out",
                 str(tmp_path / "explain")]) == 2
    assert "but data=digits reads none" in capsys.readouterr().err
    assert main(["eval", str(run), "--data-dir", str(folder), "--data", "folder", "--out",
                 str(tmp_path / "eval")]) == 0
    assert "folder test, 10 images" in capsys.readouterr().out


def test_eval_says_it_reads_the_runs_test_limit_and_limit_all_reads_every_image(
        run, caplog, capsys):
    with caplog.at_level(logging.INFO, logger="vitkit"):
        assert main(["eval", str(run), "--json"]) == 0
    assert "test: the first 200 images, as the training run read them (its test_limit); " \
        "--limit all reads every image" in caplog.text
    assert json.loads(capsys.readouterr().out)["images"] == 200
    assert main(["eval", str(run), "--json", "--limit", "all"]) == 0
    assert json.loads(capsys.readouterr().out)["images"] == len(load_digits("test").labels)
    with pytest.raises(SystemExit):
        main(["eval", str(run), "--limit", "every"])
    assert "argument --limit: 'every' is not an integer; give a number of images (>= 1) or " \
        "all" in capsys.readouterr().err
