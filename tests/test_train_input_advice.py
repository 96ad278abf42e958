"""Mistakes a new user makes with `vitkit train` on their own arrays and recipes: each gets a
message naming the problem and the fix, the fix is followed and runs, and targets that look
like another task (0/1 labels) or carry nothing to learn (a constant column) are pointed out."""

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from vitkit.cli import main

MODEL = "model=" + json.dumps({"width": 16, "depth": 1, "num_heads": 2, "mlp_dim": 32,
                               "patch_size": 4, "img_size": [16, 16]})
QUICK = ["epochs=1", "warmup_epochs=0", "batch_size=32", "progress=false"]


def _arrays(folder: Path, images: np.ndarray, targets: np.ndarray) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        np.savez(folder / f"{split}.npz", images=images, targets=targets)
    return folder


def _train(args: list[str], out: Path) -> int:
    return main(["train", MODEL, *QUICK, *args, "--out", str(out)])


def test_an_arrays_folder_without_data_arrays_is_named_and_the_fix_trains(
        tmp_path, capsys, caplog):
    rng = np.random.default_rng(0)
    folder = _arrays(tmp_path / "fields", rng.random((40, 16, 16), dtype=np.float32),
                     rng.random(40, dtype=np.float32))
    assert _train([f"data_dir={folder}"], tmp_path / "r0") == 2
    err = capsys.readouterr().err
    assert "data=arrays for the NumPy arrays it holds (test.npz and train.npz)" in err
    assert "Traceback" not in err
    with caplog.at_level(logging.INFO, logger="vitkit"):
        assert _train(["data=arrays", f"data_dir={folder}"], tmp_path / "r1") == 0  # the fix
    assert "task=regression" in caplog.text


def test_channels_last_arrays_with_two_channels_get_the_transpose_that_fixes_them(
        tmp_path, capsys, caplog):
    """(N, 16, 16, 2), u and v fields: read as 16 channels of 16x2; the message says how to
    give channels-last arrays, and the transposed arrays train as 2 channels of 16x16."""
    rng = np.random.default_rng(1)
    images, targets = rng.random((40, 16, 16, 2), dtype=np.float32), rng.random(40)
    folder = _arrays(tmp_path / "uv", images, targets)
    assert _train(["data=arrays", f"data_dir={folder}"], tmp_path / "r0") == 2
    err = capsys.readouterr().err
    assert "the images are 16x2 but the model takes 16x16" in err
    assert "read as (N, C, H, W) with C=16; if they are (N, H, W, C), transpose them first: " \
        "np.transpose(images, (0, 3, 1, 2))" in err
    two = MODEL.replace('"img_size"', '"in_chans": 2, "img_size"')  # the channels set too
    assert main(["train", two, *QUICK, "data=arrays", f"data_dir={folder}", "--out",
                 str(tmp_path / "r2")]) == 2
    assert "have 16 channel(s): set model.in_chans=16 (or leave it unset: data=arrays sizes " \
        "it from the data). The arrays were read as (N, C, H, W) with C=16; if they are " \
        "(N, H, W, C), transpose them first" in capsys.readouterr().err
    fixed = _arrays(tmp_path / "uv_first", np.transpose(images, (0, 3, 1, 2)), targets)
    with caplog.at_level(logging.INFO, logger="vitkit"):
        assert _train(["data=arrays", f"data_dir={fixed}"], tmp_path / "r1") == 0
    assert "data=arrays: 2 input channel(s)" in caplog.text


def test_pictures_of_another_size_get_no_channels_hint(tmp_path, capsys):
    rng = np.random.default_rng(2)
    folder = _arrays(tmp_path / "rgb", rng.random((40, 3, 12, 12), dtype=np.float32),
                     rng.random(40))
    assert _train(["data=arrays", f"data_dir={folder}"], tmp_path / "r0") == 2
    err = capsys.readouterr().err
    assert "the images are 12x12 but the model takes 16x16" in err and "transpose" not in err


@pytest.mark.parametrize("suffix, text", [(".toml", "epochs = 1\n"),
                                          (".yaml", "epochs: 1\n")])
def test_a_recipe_that_is_not_json_says_what_a_recipe_is_and_its_keys_run_as_arguments(
        tmp_path, capsys, suffix, text):
    recipe = tmp_path / f"recipe{suffix}"
    recipe.write_text(text)
    assert main(["train", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert f"recipe {recipe} is not valid JSON" in err and "Traceback" not in err
    assert "a recipe is a JSON object of training keys, as the shipped ones are" in err
    assert "or give the keys as KEY=VALUE arguments instead (vitkit train epochs=5" in err
    # the advice: the same keys as arguments (on the digits, from the digits recipe)
    assert main(["train", "epochs=1", "warmup_epochs=0", "progress=false", "--out",
                 str(tmp_path / "r")]) == 0


def test_zero_one_targets_train_as_regression_with_a_pointer_to_the_task(tmp_path, caplog):
    rng = np.random.default_rng(3)
    images = rng.random((40, 16, 16), dtype=np.float32)
    labels = (rng.random((40, 3)) > 0.5).astype(np.float32)
    folder = _arrays(tmp_path / "labels", images, labels)
    warning = "are all 0 or 1: they train as regression; for multi-label classification " \
        "set task=multilabel"
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        assert _train(["data=arrays", f"data_dir={folder}"], tmp_path / "r0") == 0
    assert warning in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="vitkit"):
        assert _train(["data=arrays", f"data_dir={folder}", "task=multilabel"],
                      tmp_path / "r1") == 0
    assert warning not in caplog.text and "task=multilabel" in caplog.text


def test_a_constant_target_column_is_pointed_out(tmp_path, caplog):
    rng = np.random.default_rng(4)
    targets = np.stack([rng.random(40), np.full(40, 3.0)], axis=1)
    folder = _arrays(tmp_path / "const", rng.random((40, 16, 16), dtype=np.float32), targets)
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        assert _train(["data=arrays", f"data_dir={folder}"], tmp_path / "r") == 0
    assert "target column(s) 1 (always 3) never change: there is nothing to learn" in caplog.text
    assert "column(s) 0" not in caplog.text


def test_constant_targets_are_pointed_out_and_one_sample_is_not(tmp_path, caplog):
    rng = np.random.default_rng(5)
    folder = _arrays(tmp_path / "all3", rng.random((40, 16, 16), dtype=np.float32),
                     np.full(40, 3.0))
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        assert _train(["data=arrays", f"data_dir={folder}"], tmp_path / "r") == 0
    assert "are all 3: there is nothing to learn (R^2 reads 1 for an exact fit, else 0); " \
        "check the targets file" in caplog.text
    from vitkit.tasks import infer_task

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        infer_task(np.array([[0.5, 2.0]]))  # a train_limit of 1: nothing varies, no warning
    assert caplog.text == ""


def test_a_recipe_file_without_a_model_on_the_digits_says_a_recipe_is_whole_and_both_fixes_run(
        tmp_path, capsys):
    """{"epochs": 1} is a whole recipe: TrainConfig's default model (Ti/16 at 224, 3 channels)
    cannot take the digits. The refusal says so and gives two fixes, both followed here (the
    digits recipe's model pasted from the message; its keys as KEY=VALUE arguments)."""
    recipe = tmp_path / "mine.json"
    recipe.write_text(json.dumps({"epochs": 1, "warmup_epochs": 0, "progress": False}))
    assert main(["train", str(recipe), "--out", str(tmp_path / "r0")]) == 2
    err = capsys.readouterr().err
    assert f"recipe {recipe} names no model, so the run would use TrainConfig's default, " \
        "Ti/16 (224x224, 3 channels), which cannot take the digits (8x8, 1 channel): a recipe " \
        "file is a whole recipe" in err and "Traceback" not in err
    assert "give its keys as KEY=VALUE arguments (vitkit train digits epochs=5)" in err
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
    assert "recipe digits names no model" in err and "Traceback" not in err
    assert '"model": {"variant": "Ti/2", "img_size": 8, "in_chans": 1' in err
