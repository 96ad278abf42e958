"""A recipe file is a whole JSON recipe: a file that is not JSON says what a recipe is and
that its keys run as KEY=VALUE arguments; a recipe that names no model for the digits says
it is whole and gives the digits recipe's model to paste; both fixes run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vitkit.cli import main


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


@pytest.mark.parametrize("suffix, text", [(".toml", "epochs = 1\n"),
                                          (".yaml", "epochs: 1\n")])
def test_a_recipe_that_is_not_json_says_what_a_recipe_is_and_its_keys_run_as_arguments(
        tmp_path, capsys, suffix, text):
    recipe = tmp_path / f"recipe{suffix}"
    recipe.write_text(text)
    assert main(["train", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    says(err, f"recipe {recipe}", "not valid JSON", "JSON object of training keys",
         "KEY=VALUE arguments", "vitkit train epochs=5")
    # the advice: the same keys as arguments (on the digits, from the digits recipe)
    assert main(["train", "epochs=1", "warmup_epochs=0", "progress=false", "--out",
                 str(tmp_path / "r")]) == 0


def test_a_recipe_file_without_a_model_on_the_digits_says_a_recipe_is_whole_and_both_fixes_run(
        tmp_path, capsys):
    """{"epochs": 1} is a whole recipe: TrainConfig's default model (Ti/16 at 224, 3 channels)
    cannot take the digits. The refusal says so and gives two fixes, both of which train (the
    digits recipe's model pasted from the message; its keys as KEY=VALUE arguments)."""
    recipe = tmp_path / "mine.json"
    recipe.write_text(json.dumps({"epochs": 1, "warmup_epochs": 0, "progress": False}))
    assert main(["train", str(recipe), "--out", str(tmp_path / "r0")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    says(err, f"recipe {recipe}", "names no model", "Ti/16", "224x224, 3 channels", "digits",
         "8x8, 1 channel", "whole recipe", "KEY=VALUE arguments", "vitkit train digits epochs=5")
    pasted = err.split('"model": ', 1)[1].strip()
    recipe.write_text(json.dumps({"epochs": 1, "warmup_epochs": 0, "progress": False,
                                  "model": json.loads(pasted)}))
    assert main(["train", str(recipe), "--out", str(tmp_path / "r1")]) == 0
    assert main(["train", "digits", "epochs=5", "train_limit=256", "progress=false", "--out",
                 str(tmp_path / "r2")]) == 0  # the arguments, on fewer images
    recipe.write_text(json.dumps({"epochs": 1, "data": "folder", "data_dir": str(tmp_path)}))
    assert main(["train", str(recipe), "--out", str(tmp_path / "r3")]) == 2  # other data:
    assert "names no model" not in capsys.readouterr().err  # TrainConfig's model is its call


def test_a_recipe_file_named_digits_in_the_working_folder_gets_the_shipped_model_to_paste(
        tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("digits").write_text(json.dumps({"epochs": 1}))  # the file wins over the shipped name
    assert main(["train", "digits", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    says(err, "recipe digits", "names no model")
    pasted = json.loads(err.split('"model": ', 1)[1].strip())  # the shipped digits model
    assert (pasted["variant"], pasted["img_size"], pasted["in_chans"]) == ("Ti/2", 8, 1)
