"""A new user's slips get a short message whose advice works when followed: a mistyped path
("no such file or folder: runs/digit; did you mean runs/digits?") on every verb that takes
weights, an unknown name (a few suggestions, never the whole list), and a training setting
written as a flag or as two words (`--epochs 3`, `epochs 3`: settings are KEY=VALUE)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitkit.catalog import all_names, config_of, load_pretrained, looks_like_path
from vitkit.cli import main
from vitkit.errors import ConfigError, WeightsNotFoundError

TINY = ["model.depth=1", "total_steps=2", "progress=false"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding runs/digits, a two-step digits run, and digit.png, an image."""
    root = tmp_path_factory.mktemp("workdir")
    assert main(["train", *TINY, "--out", str(root / "runs" / "digits")]) == 0
    pixels = np.zeros((8, 8), dtype=np.uint8)
    pixels[1:7, 3:5] = 255  # a light "1" on black
    Image.fromarray(pixels).save(root / "digit.png")
    return root


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


# -- item 5: a mistyped path, an unknown name ---------------------------------------------------
@pytest.mark.parametrize("verb, after", [
    ("eval", []),
    ("predict", ["digit.png"]),
    ("summary", []),
    ("finetune", ["total_steps=1", "warmup_steps=0", "data=digits", "progress=false",
                  "--out", "tuned"]),
])
def test_a_mistyped_run_folder_suggests_the_one_that_exists(verb, after, runs, capsys,
                                                            monkeypatch):
    monkeypatch.chdir(runs)
    code, _, err = run(capsys, verb, "runs/digit", *after)
    assert code == 2
    assert err.strip() == f"vitkit {verb}: error: no such file or folder: runs/digit; did you " \
                          "mean runs/digits?"
    code, out, err = run(capsys, verb, "runs/digits", *after)  # the advice, followed
    assert code == 0, err
    assert out


def test_a_mistyped_file_in_a_run_folder_is_corrected_too(runs, capsys, monkeypatch):
    monkeypatch.chdir(runs)
    code, _, err = run(capsys, "eval", "runs/digits/bset.pt")
    assert code == 2 and "no such file or folder: runs/digits/bset.pt; did you mean " \
                         "runs/digits/best.pt?" in err
    code, _, err = run(capsys, "eval", "runs/digits/best.pt")
    assert code == 0, err
    code, _, err = run(capsys, "eval", "nowhere/at/all.pt")
    assert code == 2 and "no such file or folder: nowhere/at/all.pt (nowhere does not exist)" \
                         in err


def test_an_unknown_name_gets_a_few_suggestions_not_every_name(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Image.new("L", (8, 8)).save(tmp_path / "x.png")
    for verb in ("eval", "predict", "finetune", "summary"):
        argv = [verb, "B/16-i21x", *(["x.png"] if verb == "predict" else [])]
        code, _, err = run(capsys, *argv)
        assert code == 2 and len(err) < 600, err
        assert "Did you mean 'B/16-i21k'" in err and "`vitkit models" in err
        assert sum(f"'{name}'" in err for name in all_names()) <= 5  # not the list of 44
    code, out, _ = run(capsys, "models", "--checkpoints")  # the command the message names
    assert code == 0 and "B/16-i21k" in out and "R50+L/32-augreg-i21k" in out


def test_a_variant_or_a_config_is_not_mistaken_for_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    assert not looks_like_path("B/16-i21x") and not looks_like_path("R50+B/16")
    assert looks_like_path("runs/digit") and looks_like_path("model.pt")
    assert looks_like_path("./B/16") and looks_like_path("a/b/c")
    with pytest.raises(WeightsNotFoundError, match=r"^no such file or folder: model\.pt$"):
        load_pretrained("model.pt")
    (tmp_path / "tiny.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"config file tiyn\.json does not exist; did you "
                                          r"mean tiny\.json\?"):
        config_of("tiyn.json")


# -- item 6: settings are KEY=VALUE ----------------------------------------------------------
def _train_and_follow(argv: list[str], tmp_path: Path, capsys) -> str:
    """Run `vitkit train ARGV` (refused), then its advice, total_steps=2; the refusal's text."""
    out = ["--out", str(tmp_path / "run"), "progress=false", "model.depth=1"]
    try:
        code = main(["train", *argv, *out])
    except SystemExit as exit_info:  # argparse refuses a flag
        code = exit_info.code
    err = capsys.readouterr().err
    assert code == 2 and "training settings are KEY=VALUE, e.g. total_steps=2" in err, err
    assert main(["train", "total_steps=2", *out]) == 0  # the advice, followed
    assert (tmp_path / "run" / "last.pt").exists()
    return err


@pytest.mark.parametrize("flag", [["--total-steps", "2"], ["--total_steps=2"]])
def test_a_training_setting_as_a_flag_suggests_key_value(flag, tmp_path, capsys):
    err = _train_and_follow(flag, tmp_path, capsys)
    assert f"unrecognized argument {flag[0].split('=')[0]}: training settings" in err
    assert "usage: vitkit train" in err  # the verb's usage, not the top level's


def test_a_training_setting_as_two_words_suggests_key_value(tmp_path, capsys):
    err = _train_and_follow(["total_steps", "2"], tmp_path, capsys)
    assert "'total_steps' is no recipe" in err and "no recipe file" not in err


def test_finetune_settings_as_flags_get_the_same_advice(runs, tmp_path, capsys):
    weights = str(runs / "runs" / "digits")
    with pytest.raises(SystemExit):
        main(["finetune", weights, "--total-steps", "1", "--out", str(tmp_path / "ft")])
    err = capsys.readouterr().err
    assert "unrecognized argument --total-steps: training settings are KEY=VALUE, e.g. " \
           "total_steps=1" in err and "usage: vitkit finetune" in err
    assert main(["finetune", weights, "total_steps=1", "warmup_steps=0", "data=digits",
                 "progress=false",
                 "--out", str(tmp_path / "ft")]) == 0


def test_a_recipe_word_that_is_a_setting_without_a_value(capsys, tmp_path):
    assert main(["train", "digits", "epochs", "--out", str(tmp_path)]) == 2
    assert "'epochs' is not KEY=VALUE: training settings are KEY=VALUE, e.g. epochs=..." \
        in capsys.readouterr().err
