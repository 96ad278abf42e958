"""The suite does not depend on the working directory or on what earlier tests cached: each test
runs in its own empty folder with its own caches (tests/conftest.py), so the README's set-up
`vitkit train`, run in the clone first, cannot change a test's outcome (`.ci/run` does that)."""

import os
from pathlib import Path

import pytest

from vitkit.cli import main
from vitkit.files import cache_root

REPO = Path(__file__).resolve().parents[2]
LEFT_BY_TRAIN: list[Path] = []
CACHES_SEEN: list[Path] = []


def test_a_test_runs_in_its_own_empty_folder_outside_the_clone(tmp_path):
    assert Path.cwd() == tmp_path and not any(tmp_path.iterdir())
    assert REPO not in Path.cwd().parents


@pytest.mark.parametrize("test", ["first", "second"])
def test_caches_are_the_tests_own(tmp_path, test):
    """vitkit's cache, its weights folder and Hugging Face's caches: one folder per test."""
    own = cache_root().parent
    assert REPO not in own.parents and Path.home() not in own.parents
    assert tmp_path.parent in own.parents  # a folder of this test session
    for name in ("VITKIT_WEIGHTS_DIR", "HF_HOME", "HF_DATASETS_CACHE", "XDG_CACHE_HOME"):
        assert own in Path(os.environ[name]).parents, name
    assert "HF_HUB_CACHE" not in os.environ
    assert own not in CACHES_SEEN
    CACHES_SEEN.append(own)


def test_readme_train_leaves_its_run_in_the_working_folder(tmp_path):
    """The README's first command (shortened): its run lands in ./runs/digits."""
    assert main(["train", "epochs=1", "warmup_epochs=0.5", "train_limit=64", "progress=false"]) == 0
    assert (tmp_path / "runs" / "digits" / "last.pt").is_file()
    LEFT_BY_TRAIN.append(tmp_path)


def test_the_next_test_does_not_see_it(tmp_path, capsys):
    """After `vitkit train` in one test's folder, a later test's recipe error is its own,
    not "runs/digits already holds a run"."""
    assert all((left / "runs" / "digits").is_dir() for left in LEFT_BY_TRAIN)
    assert not (tmp_path / "runs").exists()
    code = main(["train", "digits", "data=cifar10", "--data-dir", str(tmp_path / "nowhere")])
    err = capsys.readouterr().err
    assert code == 2 and "nowhere" in err and "already holds a run" not in err
