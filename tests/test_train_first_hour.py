"""A new user's first runs: `--data-dir` alone never trains on the digits, the image-folder
message describes a layout that works, `--resume` takes a run folder, `finetune RUN` uses the
run's data, every run says its plan (and an estimate) before it runs long, a resume with the
wrong recipe names the model mismatch, and a diverging resume keeps the last good last.pt."""

import logging
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit.cli import main
from vitkit.train.checkpoint import load_state

QUICK = ["total_steps=2", "warmup_steps=1", "batch_size=4", "progress=false"]


def _images(folder: Path, count: int = 4) -> None:
    """`count` 8x8 grayscale PNGs in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(len(str(folder)))
    for i in range(count):
        Image.fromarray(rng.integers(0, 255, (8, 8), dtype=np.uint8), mode="L").save(
            folder / f"{i}.png")


def _follow_layout(message: str) -> None:
    """Create every `ROOT/.../<class_name>/<image>.jpg` path the message describes, with two
    classes (`test/` stands in for val/ only when val/ is not named)."""
    for pattern in re.findall(r"([^\s(]+)/<class_name>/<image>\.jpg", message):
        for name in ("a", "b"):
            _images(Path(pattern) / name)


def _recipe(path: Path) -> dict:
    return load_state(path)["train_config"]


def test_data_dir_alone_trains_on_the_image_folder_and_says_so(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    for split in ("train", "val"):
        for name in ("cat", "dog"):
            _images(tmp_path / "images" / split / name)
    with caplog.at_level(logging.INFO, logger="vitkit.train"):
        assert main(["train", "--data-dir", "images", "model.num_classes=2", *QUICK,
                     "--out", "run"]) == 0
    assert "training on data=folder" in caplog.text
    assert _recipe(tmp_path / "run" / "last.pt")["data"] == "folder"


def test_data_dir_that_is_no_image_folder_is_refused_and_the_advice_works(tmp_path, monkeypatch,
                                                                         capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").mkdir()
    assert main(["train", "--data-dir", "mine", *QUICK, "--out", "run"]) == 2
    err = capsys.readouterr().err
    assert "data=folder" in err and "data=cifar10" in err and "Traceback" not in err
    assert not (tmp_path / "run" / "last.pt").exists()  # nothing trained on the digits
    _follow_layout(err)
    assert main(["train", "--data-dir", "mine", "data=folder", "model.num_classes=2", *QUICK,
                 "--out", "run"]) == 0


def test_the_missing_image_folder_message_describes_a_layout_that_works(tmp_path, capsys):
    root = tmp_path / "photos"
    args = ["train", "data=folder", "--data-dir", str(root), "model=Ti/2",
            "model.img_size=8", "model.in_chans=1", "model.depth=1", *QUICK,
            "--out", str(tmp_path / "run")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "train/<class_name>" in err
    _follow_layout(err)  # literally: the folders the message names
    assert main(args) == 0


def test_resume_takes_a_run_folder(tmp_path):
    out = tmp_path / "run"
    assert main(["train", "digits", "total_steps=2", "warmup_steps=1", "progress=false",
                 "--out", str(out)]) == 0
    assert main(["train", "--resume", str(out), "total_steps=3"]) == 0
    assert load_state(out / "last.pt")["position"]["step"] == 3


def test_finetune_of_a_run_uses_the_data_it_recorded(tmp_path, caplog, capsys):
    pretrained = tmp_path / "pre"
    assert main(["train", "digits", "total_steps=2", "warmup_steps=1", "model.depth=1",
                 "progress=false", "--out", str(pretrained)]) == 0
    with caplog.at_level(logging.INFO, logger="vitkit.train"):
        assert main(["finetune", str(pretrained), "total_steps=2", "warmup_steps=1",
                     "batch_size=16", "accum_steps=1", "progress=false",
                     "--out", str(tmp_path / "ft")]) == 0
    assert "fine-tuning on data=digits" in caplog.text
    assert _recipe(tmp_path / "ft" / "last.pt")["data"] == "digits"
    with pytest.raises(SystemExit):
        main(["finetune", "--help"])
    assert "hf:NAME_OR_PATH" in capsys.readouterr().out


def test_a_run_logs_its_plan_and_an_estimate_with_how_to_shorten_it(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="vitkit.train"):
        assert main(["train", "digits", "total_steps=7", "warmup_steps=1", "batch_size=16",
                     "progress=false", "--out", str(tmp_path)]) == 0
    plan = re.search(r"plan: 7 steps \(\S+ epochs of \d+ batches\), image size 8 px, batch 16, "
                     r"warmup 1 steps", caplog.text)
    assert plan, caplog.text
    assert caplog.text.index("plan:") < caplog.text.index("estimate:")
    assert re.search(r"estimate: .* for the 2 steps left .*total_steps=N, epochs=N or "
                     r"--time-budget SECONDS", caplog.text)


def test_resuming_with_another_recipe_names_the_model_not_the_warmup(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "digits", "epochs=1", "warmup_epochs=0.5", "model.depth=2",
                 "batch_size=256", "progress=false", "--out", str(out)]) == 0
    # The digits recipe's warmup_epochs=2 is longer than epochs=1, but the model is the problem.
    assert main(["train", "digits", "epochs=1", "--resume", str(out / "last.pt")]) == 2
    err = capsys.readouterr().err
    assert "another model config (depth: checkpoint 2 vs config 4" in err
    assert "warmup" not in err
    assert main(["train", "epochs=2", "--resume", str(out / "last.pt")]) == 0  # the advice


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_state(path)["model"]


def test_a_diverging_resume_keeps_the_last_good_checkpoint(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "digits", "epochs=1", "warmup_epochs=0.5", "batch_size=256",
                 "progress=false", "--out", str(out)]) == 0
    before = _weights(out / "last.pt")
    capsys.readouterr()
    assert main(["train", "--resume", str(out / "last.pt"), "epochs=2", "lr=1e6",
                 "nonfinite=stop"]) == 2
    err = capsys.readouterr().err
    after = _weights(out / "last.pt")
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert all(torch.isfinite(tensor).all() for tensor in after.values())
    assert f"{out / 'last.pt'}" in err and "before the divergence" in err
    assert (out / "diverged.pt").is_file() and str(out / "diverged.pt") in err
    for _ in range(8):  # follow the advice (a tenth of the rate) until the run goes through
        advised = re.search(r"lr=([0-9.e+-]+)\)", err).group(1)
        resume = re.search(r"--resume (\S+) and the new setting", err).group(1)
        if main(["train", "--resume", resume, "epochs=2", f"lr={advised}"]) == 0:
            break
        err = capsys.readouterr().err
        assert all(torch.equal(before[name], tensor) for name, tensor in
                   _weights(out / "last.pt").items())  # each try starts from the good one
    else:
        pytest.fail("following the advice never trained")
    assert load_state(out / "last.pt")["position"]["step"] == 10
