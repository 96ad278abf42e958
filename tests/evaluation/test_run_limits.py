"""Verbs that read a run's data read what the run read: its first train_limit / test_limit
images, which they say, with the way to read every image (--limit all for eval, naming the
data for probe); each limit's report is kept apart from the whole split's."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from vitkit.cli import main
from vitkit.data.sources.digits import load_digits


def says(text, *parts):
    """Assert that the message names each part (case-insensitive), showing it otherwise."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"message lacks {missing}: {text}"

TINY = ['model={"img_size": 16, "patch_size": 8, "width": 16, "depth": 1, "num_heads": 2, '
        '"mlp_dim": 32}', "epochs=1", "batch_size=4", "warmup_epochs=0", "progress=false"]


def test_probe_says_it_reads_the_runs_image_limit_and_naming_the_data_reads_all(
        tmp_path, caplog, capsys):
    run = tmp_path / "run"
    assert main(["train", "train_limit=64", "test_limit=40", *TINY[1:], 'model={"img_size": 8, '
                 '"patch_size": 4, "width": 16, "depth": 1, "num_heads": 2, "mlp_dim": 32, '
                 '"in_chans": 1}', "--out", str(run)]) == 0
    with caplog.at_level(logging.INFO, logger="vitkit"):
        assert main(["probe", str(run), "--json", str(tmp_path / "limited.json")]) == 0
    says(caplog.text, "first 64 images", "train_limit", "--data digits", "every image")
    assert json.loads((tmp_path / "limited.json").read_text())["train_images"] == 64
    assert main(["probe", str(run), "--data", "digits", "--json",
                 str(tmp_path / "all.json")]) == 0  # the advice followed
    assert json.loads((tmp_path / "all.json").read_text())["train_images"] > 64
    # eval: the run's first 40 held-out images and every one, each in a report of its own
    assert main(["eval", str(run)]) == 0 and main(["eval", str(run), "--limit", "all"]) == 0
    assert json.loads((run / "eval-digits-test-first40.json").read_text())["images"] == 40
    assert json.loads((run / "eval-digits-test.json").read_text())["images"] > 40


QUICK = ["epochs=1", "warmup_epochs=0", "train_limit=256", "test_limit=200", "progress=false"]


@pytest.fixture
def run(tmp_path: Path) -> Path:
    out = tmp_path / "run"
    assert main(["train", *QUICK, "--out", str(out)]) == 0
    return out


def test_eval_says_it_reads_the_runs_test_limit_and_limit_all_reads_every_image(
        run, caplog, capsys):
    with caplog.at_level(logging.INFO, logger="vitkit"):
        assert main(["eval", str(run), "--json"]) == 0
    says(caplog.text, "first 200 images", "test_limit", "--limit all", "every image")
    assert json.loads(capsys.readouterr().out)["images"] == 200
    assert main(["eval", str(run), "--json", "--limit", "all"]) == 0
    assert json.loads(capsys.readouterr().out)["images"] == len(load_digits("test").labels)
    with pytest.raises(SystemExit):
        main(["eval", str(run), "--limit", "every"])
    says(capsys.readouterr().err, "argument --limit", "'every'", ">= 1", "all")

