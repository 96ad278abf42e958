"""Class indices given as numbers rather than class folders. Integer array labels are class
indices: a held-out class the training split lacks gets an output, classes numbered from 1
are warned of, and labels that are no class indices (1000-1002) are refused with both fixes
(renumber, or task=regression for quantities). A `targets.csv` column of whole
numbers trains, evaluates and explains as a classifier with task=classification (without it,
as regression, with a pointer to the task); arrays holding class indices as floats are told
to store them as integers. Each refusal is followed by its advice, which then runs."""

import io
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit.cli import main

MODEL = "model=" + json.dumps({"width": 16, "depth": 1, "num_heads": 2, "mlp_dim": 32,
                               "patch_size": 4, "img_size": [16, 16]})
QUICK = ["warmup_epochs=0", "batch_size=15", "progress=false"]
COLOURS = np.array([[220, 30, 30], [30, 220, 30], [30, 30, 220]])


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


def _colour_table(root: Path, fraction: bool = False) -> Path:
    """root/train (30 images) and root/val (9): noisy red, green or blue squares, class
    indices 0, 1, 2 in targets.csv (`fraction`: 0.5, 1.5, 2.5, which are not indices)."""
    rng = np.random.default_rng(0)
    for split, count in (("train", 30), ("val", 9)):
        (root / split / "img").mkdir(parents=True)
        lines = ["file,colour"]
        for i in range(count):
            pixels = COLOURS[i % 3] + rng.normal(0, 20, (16, 16, 3))
            Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(
                root / split / "img" / f"{i}.png")
            lines.append(f"img/{i}.png,{i % 3 + 0.5 if fraction else i % 3}")
        (root / split / "targets.csv").write_text("\n".join(lines) + "\n")
    return root


def _explained_classes(weights: Path, out: Path, *data: str) -> list[str]:
    """The true classes of the 3 images `vitkit explain` draws ("folder test #4: 1 -> 1")."""
    assert main(["explain", str(weights), "--num-images", "3", *data, "--out", str(out)]) == 0
    names = json.loads((out / "explain.json").read_text())["images"]
    return sorted(name.split(": ", 1)[1].split(" -> ")[0] for name in names)


def test_a_classifier_of_class_folders_is_explained_on_a_table_of_class_indices(tmp_path):
    table = _colour_table(tmp_path / "table")
    for split in ("train", "val"):  # the same images in class folders
        for line in (table / split / "targets.csv").read_text().splitlines()[1:]:
            file, index = line.split(",")
            (tmp_path / "folders" / split / f"c{index}").mkdir(parents=True, exist_ok=True)
            (table / split / file).rename(tmp_path / "folders" / split / f"c{index}" /
                                          Path(file).name)
    assert _train(["data=folder", f"data_dir={tmp_path / 'folders'}", "epochs=1"],
                  tmp_path / "run") == 0
    _colour_table(tmp_path / "table2")
    assert _explained_classes(tmp_path / "run" / "best.pt", tmp_path / "explain", "--data",
                              "folder", "--data-dir", str(tmp_path / "table2")) == \
        ["0", "1", "2"]


def _train(args: list[str], out: Path) -> int:
    return main(["train", MODEL, *QUICK, *args, "--out", str(out)])


def test_a_table_of_class_indices_trains_evaluates_and_explains_as_a_classifier(
        tmp_path, capsys, caplog):
    data = ["data=folder", f"data_dir={_colour_table(tmp_path / 'colours')}"]
    with caplog.at_level(logging.INFO, logger="vitkit"):
        assert _train([*data, "epochs=1"], tmp_path / "as_values") == 0
    says(caplog.text, "whole numbers", "regression", "class indices", "targets.csv",
         "task=classification")
    says(caplog.text, "task=regression", "1 target(s)")
    assert _train([*data, "epochs=4", "task=classification"], tmp_path / "run") == 0  # advice
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run" / "best.pt"), "--out",
                 str(tmp_path / "eval")]) == 0
    report = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert report["images"] == 9 and list(report["per_class_accuracy"]) == ["0", "1", "2"]
    assert report["top1"] >= 8 / 9  # red, green and blue squares are told apart
    assert _explained_classes(tmp_path / "run" / "best.pt", tmp_path / "explain") == \
        ["0", "1", "2"]  # one image per class, named by its class
    assert main(["train", "--resume", str(tmp_path / "run" / "last.pt"), "epochs=5"]) == 0
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run" / "last.pt"), "--out",
                 str(tmp_path / "eval5")]) == 0  # the resumed run is still a classifier
    assert list(json.loads((tmp_path / "eval5" / "eval.json").read_text())[
        "per_class_accuracy"]) == ["0", "1", "2"]


def test_a_table_of_fractions_is_refused_as_class_indices_and_trains_as_regression(
        tmp_path, capsys):
    data = ["data=folder", f"data_dir={_colour_table(tmp_path / 'halves', fraction=True)}",
            "epochs=1"]
    assert _train([*data, "task=classification"], tmp_path / "r0") == 2
    err = capsys.readouterr().err
    says(err, "task=classification", "integer class indices", "float32", "(30, 1)",
         "task=regression")
    assert "Traceback" not in err
    assert _train([*data, "task=regression"], tmp_path / "r1") == 0


@pytest.mark.parametrize("shape", [(30,), (30, 1)])
def test_float_class_indices_in_arrays_are_told_to_be_stored_as_integers(tmp_path, capsys,
                                                                           shape):
    rng = np.random.default_rng(1)
    images = rng.random((30, 16, 16), dtype=np.float32)
    targets = (np.arange(30) % 3).astype(np.float64).reshape(shape)
    folder = tmp_path / "floats"
    folder.mkdir()
    for split in ("train", "test"):
        np.savez(folder / f"{split}.npz", images=images, targets=targets)
    args = ["data=arrays", f"data_dir={folder}", "epochs=1", "task=classification"]
    assert _train(args, tmp_path / "r0") == 2
    err = capsys.readouterr().err
    says(err, "whole numbers", "floats", "integer class indices",
         "targets.reshape(-1).astype(np.int64)")
    for split in ("train", "test"):  # the advice
        np.savez(folder / f"{split}.npz", images=images,
                 targets=targets.reshape(-1).astype(np.int64))
    assert _train(args, tmp_path / "r1") == 0


def test_a_float_column_of_class_indices_in_a_hugging_face_dataset_gets_its_cast(
        tmp_path, capsys, caplog):
    datasets = pytest.importorskip("datasets")
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Value
    from datasets import Image as HFImage

    datasets.disable_progress_bars()
    rng = np.random.default_rng(2)
    pngs = []
    for i in range(24):
        buffer = io.BytesIO()
        pixels = np.clip(COLOURS[i % 3] + rng.normal(0, 20, (16, 16, 3)), 0, 255)
        Image.fromarray(pixels.astype(np.uint8)).save(buffer, format="PNG")
        pngs.append({"bytes": buffer.getvalue(), "path": None})
    whole = Dataset.from_dict({"image": pngs, "label": [float(i % 3) for i in range(24)]},
                              features=Features({"image": HFImage(), "label": Value("float32")}))
    splits = DatasetDict(train=whole.select(range(15)), test=whole.select(range(15, 24)))
    splits.save_to_disk(str(tmp_path / "floats"))
    with caplog.at_level(logging.INFO, logger="vitkit"):
        assert _train([f"data=hf:{tmp_path / 'floats'}", "epochs=1"], tmp_path / "r0") == 0
    says(caplog.text, "whole numbers", "regression", "class indices", "task=classification",
         "targets.reshape(-1).astype(np.int64)",
         "ds.cast_column(NAME, datasets.ClassLabel(num_classes=K))")
    splits.cast_column("label", ClassLabel(num_classes=3)).save_to_disk(  # the advice
        str(tmp_path / "classes"))
    with caplog.at_level(logging.INFO, logger="vitkit"):
        assert _train([f"data=hf:{tmp_path / 'classes'}", "epochs=1"], tmp_path / "r1") == 0
    assert "3 classes found" in caplog.text


SMALL = ["data=arrays", "model.depth=1", "model.width=16", "model.num_heads=2",
         "model.mlp_dim=32", "model.patch_size=4", "model.img_size=8", "epochs=1",
         "batch_size=16", "warmup_epochs=0", "progress=false"]


def _arrays(root: Path, train_targets: np.ndarray, test_targets: np.ndarray | None = None,
            **extra) -> Path:
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    test_targets = train_targets if test_targets is None else test_targets
    for split, targets in (("train", train_targets), ("test", test_targets)):
        images = rng.random((len(targets), 8, 8), dtype=np.float32)
        np.savez(root / f"{split}.npz", images=images, targets=targets,
                 **(extra if split == "train" else {}))
    return root


def test_a_held_out_class_the_training_split_lacks_gets_an_output(tmp_path: Path,
                                                                  caplog) -> None:
    data = _arrays(tmp_path / "d", np.arange(32) % 3, np.arange(32) % 4)
    with caplog.at_level(logging.INFO, logger="vitkit"):
        assert main(["train", *SMALL, f"data_dir={data}", "--out", str(tmp_path / "run")]) == 0
    says(caplog.text, "class index(es) 3", "held-out split", "never in training")
    weights = torch.load(tmp_path / "run" / "last.pt", weights_only=True)["model"]
    assert weights["head.weight"].shape[0] == 4
    assert main(["eval", str(tmp_path / "run"), "--out", str(tmp_path / "eval")]) == 0


def test_classes_numbered_from_one_are_warned_of_and_numbering_from_zero_is_quiet(
        tmp_path: Path, caplog) -> None:
    """Labels 1..3 give a 4-way head whose output 0 is never trained: the run warns and
    advises numbering from 0; labels 0..2 train quietly with 3 outputs."""
    data = _arrays(tmp_path / "d", np.arange(32) % 3 + 1)
    with caplog.at_level(logging.INFO, logger="vitkit"):
        assert main(["train", *SMALL, f"data_dir={data}", "--out", str(tmp_path / "r1")]) == 0
    says(caplog.text, "class index(es) 0", "neither split", "numbered from 1", "never trained",
         "number the classes 0..2")
    caplog.clear()
    renumbered = _arrays(tmp_path / "d0", np.arange(32) % 3)  # the advice followed
    with caplog.at_level(logging.INFO, logger="vitkit"):
        assert main(["train", *SMALL, f"data_dir={renumbered}", "--out",
                     str(tmp_path / "r0")]) == 0
    assert "occur in neither split" not in caplog.text
    assert torch.load(tmp_path / "r0" / "last.pt", weights_only=True)["model"][
        "head.weight"].shape[0] == 3


def test_labels_that_are_no_class_indices_are_refused_and_both_fixes_work(
        tmp_path: Path, capsys) -> None:
    data = _arrays(tmp_path / "ids", np.arange(32) % 3 + 1000)
    assert main(["train", *SMALL, f"data_dir={data}", "--out", str(tmp_path / "a")]) != 0
    err = capsys.readouterr().err
    says(err, "class indices", "1002", "only 3", "1003 outputs", "number the classes 0..2",
         "quantities", "task=regression")
    assert main(["train", *SMALL, f"data_dir={data}", "task=regression",
                 "--out", str(tmp_path / "b")]) == 0
    renumbered = _arrays(tmp_path / "renumbered", np.arange(32) % 3)
    assert main(["train", *SMALL, f"data_dir={renumbered}", "--out", str(tmp_path / "c")]) == 0
    head = torch.load(tmp_path / "c" / "last.pt", weights_only=True)["model"]["head.weight"]
    assert head.shape[0] == 3
