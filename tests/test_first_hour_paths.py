"""Mistakes of a first hour found by following the docs as a newcomer: each is refused with a
message naming the problem and a fix, and the fix is then followed and runs (a patch size that
does not divide the data's images, a run folder with no checkpoint to resume, a file where a
folder is needed and the reverse, a --data-dir that the run's data does not read)."""

from pathlib import Path

import pytest
from PIL import Image

from vitkit.cli import main

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
        "has no last.pt to continue from. To start over (deletes those files): --overwrite" in err
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
