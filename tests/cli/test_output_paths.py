"""Output paths on the command line: a report never replaces a checkpoint, a file is not
taken where a folder is needed nor the reverse, and a file path ending in a separator is
refused as a folder; each refusal names a path that works, and it does."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from vitkit.arguments import output_file
from vitkit.cli import main
from vitkit.cli.benchmark import FIGURE_SUFFIXES


def says(text, *parts):
    """Assert that the message names each part (case-insensitive), showing it otherwise."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"message lacks {missing}: {text}"


def test_a_figure_may_replace_an_earlier_figure_of_any_format(tmp_path):
    earlier = tmp_path / "sweep.pdf"
    earlier.write_bytes(b"%PDF")
    assert output_file("sweep.png", FIGURE_SUFFIXES)(str(earlier)) == str(earlier)
    checkpoint = tmp_path / "best.pt"
    checkpoint.write_bytes(b"weights")
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        output_file("sweep.png", FIGURE_SUFFIXES)(str(checkpoint))
    says(str(refused.value), str(checkpoint), "exists", ".png")


def test_probe_json_onto_a_checkpoint_is_refused_and_a_json_path_works(digits_run_copy, capsys):
    run = digits_run_copy
    before = (run / "best.pt").read_bytes()
    for verb in ("probe", "fewshot"):
        with pytest.raises(SystemExit) as refused:  # argparse's usage error
            main([verb, str(run), "--json", str(run / "best.pt")])
        assert refused.value.code == 2
        says(capsys.readouterr().err, f"{run / 'best.pt'} exists", ".json",
             f"e.g. {run / 'report.json'}")
    assert (run / "best.pt").read_bytes() == before
    assert main(["probe", str(run), "--json", str(run / "report.json")]) == 0
    assert json.loads((run / "report.json").read_text())


def test_a_file_for_a_folder_and_a_folder_for_a_file_are_named_with_the_fix(
        digits_run, tmp_path, capsys):
    for where, shown in ((digits_run / "best.pt", f"{digits_run / 'best.pt'}"),
                         (digits_run / "best.pt" / "eval", f"{digits_run / 'best.pt' / 'eval'}: "
                                                    f"{digits_run / 'best.pt'}")):
        with pytest.raises(SystemExit) as exited:  # refused before any work
            main(["eval", str(digits_run), "--out", str(where)])
        err = capsys.readouterr().err
        assert exited.value.code == 2 and "Traceback" not in err
        says(err, "vitkit eval: error: argument --out", shown, "is a file", "folder path")
    assert main(["eval", str(digits_run), "--out", str(tmp_path / "eval")]) == 0
    with pytest.raises(SystemExit) as exited:
        main(["probe", str(digits_run), "--json", str(tmp_path / "eval")])
    assert exited.value.code == 2
    says(capsys.readouterr().err, "vitkit probe: error: argument --json",
         f"{tmp_path / 'eval'} is a folder", f"e.g. {tmp_path / 'eval' / 'report.json'}")
    assert main(["probe", str(digits_run), "--json", str(tmp_path / "eval" / "report.json")]) == 0


@pytest.mark.parametrize("argv, flag, example", [
    (["probe", "W"], "--json", "report.json"),
    (["fewshot", "W"], "--json", "report.json"),
    (["benchmark", "--sweep", "--variants", "cifar10-tutorial", "--resolutions", "32",
      "--memory-gb", "1", "--batch-size", "2", "--warmup", "0", "--iters", "1"], "--out",
     "sweep.png")])
def test_a_file_path_ending_in_a_separator_is_refused_as_a_folder(
        argv, flag, example, tmp_path, capsys):
    """A file-valued output ending in a separator names a folder, even one not made yet:
    every such argument refuses it at once, naming a file in that folder to give instead
    (export's --out is checked by export itself: inference/test_export.py)."""
    for folder in (f"{tmp_path / 'new'}{os.sep}", f"{tmp_path / 'new'}{os.sep}."):
        with pytest.raises(SystemExit) as exited:
            main([*argv, flag, folder])
        err = capsys.readouterr().err
        assert exited.value.code == 2 and "Traceback" not in err
        says(err, f"vitkit {argv[0]}: error: argument {flag}", f"{folder} names a folder",
             f"e.g. {tmp_path / 'new' / example}")

    assert list(tmp_path.iterdir()) == []


def test_a_json_report_into_a_folder_not_made_yet_follows_the_advice(digits_run, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["probe", str(digits_run), "--json", f"{tmp_path / 'reports'}{os.sep}"])
    assert f"e.g. {tmp_path / 'reports' / 'report.json'}" in capsys.readouterr().err
    assert not (tmp_path / "reports").exists()
    report = tmp_path / "reports" / "report.json"
    assert main(["probe", str(digits_run), "--json", str(report)]) == 0
    assert (tmp_path / "reports" / "report.json").is_file()
