"""Resuming on other data or into another folder.

On data with other classes it is refused: the head and its class names are the checkpoint's,
so more classes cannot fit it (and model.num_classes=3 cannot change it on a resume), and fewer
or renamed ones would train under the wrong names. The message names both sets of classes and
two fixes, and both work. Resumed into another --out with nothing left to train, the new
folder gets the run's checkpoints and learning curve, as the last line says, not only its
metrics."""

import re
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit.cli import main


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


TINY = ('model={"variant": "Ti/4", "img_size": 16, "width": 16, "depth": 1, "num_heads": 2, '
        '"mlp_dim": 32}')
QUICK = ["warmup_epochs=0", "batch_size=8", "progress=false"]


def _image_folder(root: Path, names: list[str], per_class: int = 4) -> None:
    rng = np.random.default_rng(len(names))
    for split in ("train", "val"):
        for shade, name in enumerate(names):
            folder = root / split / name
            folder.mkdir(parents=True)
            for index in range(per_class):
                pixels = np.clip(40 + 80 * shade + rng.normal(0, 20, (16, 16, 3)), 0, 255)
                Image.fromarray(pixels.astype(np.uint8)).save(folder / f"{index}.png")


@pytest.fixture
def run(tmp_path: Path, monkeypatch) -> Path:
    """runs/pets: trained one epoch on pets/ (dark, light), from tmp_path."""
    monkeypatch.chdir(tmp_path)
    _image_folder(tmp_path / "pets", ["dark", "light"])
    assert main(["train", "data=folder", "data_dir=pets", TINY, "epochs=1", *QUICK,
                 "--out", "runs/pets"]) == 0
    return tmp_path / "runs" / "pets"


@pytest.mark.parametrize("names", [["dark", "light", "mid"], ["cat", "dog"], ["dark"]],
                         ids=["more", "renamed", "fewer"])
def test_resuming_on_other_classes_is_refused_naming_both_and_the_fixes(
        run: Path, tmp_path: Path, names: list[str], capsys, monkeypatch) -> None:
    """More, renamed or fewer classes: the refusal names both sets and leaves the checkpoint
    as it was; the fine-tune it suggests trains and the resume without the data settings works
    (fewer: one class, which no classifier fine-tunes on, is said so)."""
    _image_folder(tmp_path / "other set", names, per_class=8)
    before = torch.load(run / "last.pt", weights_only=True)["position"]
    assert main(["train", "--resume", str(run), "epochs=2", "--data-dir", "other set"]) == 2
    err = capsys.readouterr().err
    shown = ", ".join(names)
    says(err, f"cannot resume from {run / 'last.pt'}", "2 classes (dark, light)",
         f"other set holds {len(names)} ({shown})", "resume without --data/--data-dir",
         "data=folder data_dir=pets", "fine-tune from it")
    assert torch.load(run / "last.pt", weights_only=True)["position"] == before  # untouched
    if len(names) == 1:  # fewer: one class, on which no classifier is fine-tuned
        says(err, "two classes or more", "holds one")
        assert "vitkit finetune" not in err
        return
    says(err, "vitkit finetune ")

    finetune = shlex.split(re.search(r"vitkit (finetune .+)$", err.strip())[1])
    assert finetune[-2:] == ["--data-dir", "other set"]  # quoted for the shell
    assert main([*finetune, "total_steps=2", "warmup_steps=0", "batch_size=8", "accum_steps=1",
                 "progress=false", "--out", "tuned"]) == 0
    assert torch.load(tmp_path / "tuned" / "last.pt", weights_only=True)["classes"] == names
    elsewhere = tmp_path / "elsewhere"  # the first fix, from another working folder too
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["train", "--resume", str(run), "epochs=2"]) == 0
    assert torch.load(run / "last.pt", weights_only=True)["position"]["epoch"] == 2


def test_the_finetune_advice_for_a_hugging_face_dataset_keeps_its_splits(
        run: Path, tmp_path: Path, capsys) -> None:
    """Splits named other than the defaults: the suggested command reads the same ones."""
    datasets = pytest.importorskip("datasets")
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8))
              for _ in range(12)]
    features = datasets.Features({"image": datasets.Image(),
                                  "label": datasets.ClassLabel(names=["cat", "dog", "owl"])})
    part = datasets.Dataset.from_dict({"image": images, "label": [i % 3 for i in range(12)]},
                                      features=features)
    datasets.DatasetDict(fit=part, holdout=part.select(range(6))).save_to_disk(
        str(tmp_path / "animals"))
    spec = f"hf:{tmp_path / 'animals'}"
    assert main(["train", "--resume", str(run), "epochs=2", "--data", spec, "train_split=fit",
                 "split=holdout"]) == 2
    err = capsys.readouterr().err
    says(err, "2 classes (dark, light)", spec)
    finetune = shlex.split(re.search(r"vitkit (finetune .+)$", err.strip())[1])
    assert finetune[-4:] == ["--data", spec, "train_split=fit", "split=holdout"]
    assert main([*finetune, "total_steps=2", "warmup_steps=0", "batch_size=8", "accum_steps=1",
                 "progress=false", "--out", str(tmp_path / "tuned")]) == 0
    assert torch.load(tmp_path / "tuned" / "last.pt", weights_only=True)["classes"] == \
        ["cat", "dog", "owl"]


def test_the_runs_own_data_grown_a_class_since_is_said_so(run: Path, tmp_path: Path,
                                                         capsys) -> None:
    """Resumed as before (no data settings) after pets/ gained a class: the message says the
    run's data changed rather than advising to leave out settings not given."""
    _image_folder(tmp_path / "extra", ["dark", "light", "mid"], per_class=8)
    for split in ("train", "val"):
        shutil.copytree(tmp_path / "extra" / split / "mid", tmp_path / "pets" / split / "mid")
    assert main(["train", "--resume", str(run), "epochs=2"]) == 2
    err = capsys.readouterr().err
    says(err, "2 classes (dark, light)", "holds 3 (dark, light, mid)", "data has changed",
         "restore its classes", "vitkit finetune ")
    finetune = shlex.split(re.search(r"vitkit (finetune .+)$", err.strip())[1])
    assert main([*finetune, "total_steps=2", "warmup_steps=0", "batch_size=8", "accum_steps=1",
                 "progress=false", "--out", "tuned"]) == 0
    for split in ("train", "val"):  # restored, it resumes
        shutil.rmtree(tmp_path / "pets" / split / "mid")
    assert main(["train", "--resume", str(run), "epochs=2"]) == 0


def test_a_cifar_copy_without_its_names_file_resumes(tmp_path: Path, monkeypatch) -> None:
    """Without batches.meta.txt CIFAR's classes are named 0..9: the same ten classes, not
    other ones, so the run resumes on the copy."""
    rng = np.random.default_rng(0)
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
             "truck"]
    for folder, meta in (("c10", True), ("copy", False)):
        root = tmp_path / folder / "cifar-10-batches-bin"
        root.mkdir(parents=True)
        for index, file in enumerate([*(f"data_batch_{i}.bin" for i in range(1, 6)),
                                      "test_batch.bin"]):
            records = np.random.default_rng(index).integers(0, 256, (2, 3073), dtype=np.uint8)
            records[:, 0] = rng.integers(0, 10, 2)
            records.tofile(root / file)
        if meta:
            (root / "batches.meta.txt").write_text("\n".join(names) + "\n")
    monkeypatch.chdir(tmp_path)
    model = TINY.replace('"img_size": 16', '"img_size": 32')
    assert main(["train", "data=cifar10", "data_dir=c10", model, "epochs=1", *QUICK,
                 "--out", "runs/c"]) == 0
    assert main(["train", "--resume", "runs/c", "epochs=2", "--data-dir", "copy"]) == 0


def test_resuming_on_the_same_classes_elsewhere_still_works(run: Path, tmp_path: Path) -> None:
    """A copy of the data in another folder holds the run's classes: it resumes."""
    _image_folder(tmp_path / "copy", ["dark", "light"])
    assert main(["train", "--resume", str(run), "epochs=2", "--data-dir", "copy"]) == 0
    assert torch.load(run / "last.pt", weights_only=True)["position"]["epoch"] == 2


def test_a_finished_run_resumed_into_another_folder_is_written_there(run: Path,
                                                                      tmp_path: Path) -> None:
    assert main(["train", "--resume", str(run), "--out", "copy"]) == 0  # nothing to train
    copy = tmp_path / "copy"
    assert {"last.pt", "metrics.jsonl", "learning_curve.png"} <= {p.name for p in copy.iterdir()}
    saved, original = (torch.load(folder / "last.pt", weights_only=True)
                       for folder in (copy, run))
    assert saved["position"]["step"] == original["position"]["step"] == 1
    assert all(torch.equal(saved["model"][key], value)
               for key, value in original["model"].items())
    assert main(["eval", str(copy)]) == 0
    assert main(["train", "--resume", str(copy), "epochs=2"]) == 0  # and it goes on there
    assert torch.load(copy / "last.pt", weights_only=True)["position"]["epoch"] == 2
    assert torch.load(run / "last.pt", weights_only=True)["position"]["epoch"] == 1
